"""Worker process entry: `python -m tools.engines.worker JOB.json OUT_DIR`."""
from __future__ import annotations

import json
import sys


def main(job_path: str, out_dir: str) -> int:
    import torch

    from tools import trace as trace_io
    from tools.engines import get_engine
    from tools.engines.protocol import RunJob

    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    job = RunJob.from_json(json.loads(open(job_path).read()))
    trace = get_engine(job.spec.engine).run(job)
    trace_io.save(trace, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
