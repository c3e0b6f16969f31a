"""torch.compile measured honestly: compile time, speed-up after warm-up, break-even, graph breaks, recompiles.

Every speed figure here is measured side by side on this machine (`ptlab.timing.compare`); what a
notebook claims about it is a ratio with a wide margin, never an absolute time.

- `measuring`: compile against eager (`measure_compile`, `format_compile_table`) and training drift;
- `breaks`: graph breaks (`explain_breaks`) and what `fullgraph=True` raises;
- `recompiles`: graphs and recompiles per call (`count_compiles`), TORCH_LOGS collected in-process;
- `inductor`: Inductor's cache, vector code and compile threads on this machine;
- `logs`: torch's compile loggers quieted or routed for one block.
"""
from .breaks import GraphBreaks, explain_breaks, fullgraph_error
from .inductor import (
    compile_pools_started,
    compile_threads_rule,
    inductor_vectorizes,
    use_inductor_cache_per_cpu_capability,
)
from .logs import quiet_compile_logs
from .measuring import (
    CompileReport,
    TrainingDrift,
    compiled_training_drift,
    format_compile_table,
    inference_call,
    measure_compile,
    training_step,
)
from .recompiles import CompileCount, CompileLogs, capture_compile_logs, count_compiles

__all__ = [
    "CompileCount", "CompileLogs", "CompileReport", "GraphBreaks", "TrainingDrift", "capture_compile_logs",
    "compile_pools_started", "compile_threads_rule", "compiled_training_drift", "count_compiles", "explain_breaks",
    "format_compile_table", "fullgraph_error", "inductor_vectorizes", "inference_call", "measure_compile",
    "quiet_compile_logs", "training_step", "use_inductor_cache_per_cpu_capability",
]
