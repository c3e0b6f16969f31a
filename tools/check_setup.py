"""Before `make` installs anything: is this Python usable, and is an existing .venv still sound?

Runs with the system Python, whatever its version, so it uses nothing newer than Python 3.6.
Exit 0 when the set-up can go on; otherwise one message saying what to do, and exit 1.
"""
import os
import shutil
import subprocess
import sys

MINIMUM = (3, 10)
REFERENCE = "3.11"  # the notebooks' outputs were made, and CI runs, on this version
FREE_GB_NEEDED = 10  # the venv takes about 6.4 GB on Linux x86-64, pip's cache more while it installs


def fail(message):
    sys.stderr.write("\nmake: cannot set up the course: " + message + "\n\n")
    sys.exit(1)


def check_python():
    version = "%d.%d" % sys.version_info[:2]
    if sys.version_info[:2] < MINIMUM:
        fail("%s is Python %s; the course needs Python %d.%d or newer (%s recommended).\n"
             "  macOS: brew install python@%s, then: make PYTHON=python%s lab\n"
             "  Debian/Ubuntu: sudo apt-get install python3.11 python3.11-venv, then: make PYTHON=python3.11 lab"
             % (sys.executable, version, MINIMUM[0], MINIMUM[1], REFERENCE, REFERENCE, REFERENCE))
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        fail("this Python has no working venv module.\n"
             "  Debian/Ubuntu: sudo apt-get install python%s-venv, then run make again." % version)


def check_existing_venv(venv_dir):
    python = os.path.join(venv_dir, "bin", "python")
    if not os.path.isdir(venv_dir):
        free_gb = shutil.disk_usage(os.path.dirname(os.path.abspath(venv_dir))).free / 2**30
        if free_gb < FREE_GB_NEEDED:
            fail("only %.1f GB free here; the first install needs about %d GB (torch with CUDA is large)."
                 % (free_gb, FREE_GB_NEEDED))
        return
    advice = "Remove it with `make clean`, then run make again (it reinstalls, a few minutes)."
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.prefix); print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        fail("%s exists but its Python does not run (%s). %s" % (venv_dir, err, advice))
    if out.returncode != 0:
        fail("%s exists but its Python does not run: %s %s" % (venv_dir, out.stderr.strip()[-300:], advice))
    prefix, version = out.stdout.split()
    # A moved venv still runs its python, but every script in bin/ starts the python of the old path.
    for script in ("pip", "jupyter"):
        path = os.path.join(venv_dir, "bin", script)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                first = handle.readline().decode("utf-8", "replace").strip()
            target = first[2:].strip().split()[0] if first.startswith("#!") else ""
            if target and os.path.realpath(os.path.dirname(os.path.dirname(target))) != os.path.realpath(venv_dir):
                fail("%s was made in another folder (its %s starts %s): a virtual environment cannot move. %s"
                     % (venv_dir, script, target, advice))
    if tuple(int(p) for p in version.split(".")) < MINIMUM:
        fail("%s was made with Python %s; the course needs %d.%d or newer. %s" % (venv_dir, version, MINIMUM[0],
                                                                                  MINIMUM[1], advice))


if __name__ == "__main__":
    check_python()
    check_existing_venv(sys.argv[1] if len(sys.argv) > 1 else ".venv")
