"""Old path of the readiness checks, kept for notebooks written against it: see ptlab.course.doctor."""
from ptlab.amp import native_bf16  # noqa: F401
from ptlab.course.doctor import *  # noqa: F401,F403
from ptlab.course.doctor import inductor_build_check, inductor_compiler_check, report, run_checks  # noqa: F401
