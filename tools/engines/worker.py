"""Worker process entry: `python -m tools.engines.worker JOB.json OUT_DIR`."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tools.engines.funccov import function_coverage


def main(job_path: str, out_dir: str) -> int:
    import torch

    from tools import trace as trace_io
    from tools.engines import get_engine
    from tools.engines.protocol import RunJob

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    job = RunJob.from_json(json.loads(Path(job_path).read_text()))
    started = time.monotonic()
    with function_coverage(job.coverage_root) as covered:
        trace = get_engine(job.spec.engine).run(job)
    if job.coverage_root:
        trace.meta["coverage"] = sorted(f"{f}:{q}" for f, q in covered)
    saving = time.monotonic()
    trace_io.save(trace, out_dir)
    # where the worker's time went, for benchmark.perf (the runner adds start-up and loading)
    timing = {"engine_s": saving - started, "save_s": time.monotonic() - saving}
    (Path(out_dir) / "timing.json").write_text(json.dumps(timing))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
