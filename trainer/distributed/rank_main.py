"""What torchrun runs on each rank: `python -m trainer.distributed.rank_main <control folder>`.

Joins the process group, then runs the ordinary loop (`trainer.loop.train_in_process`) on the spec in
`job.json`: rank 0 reports to `sink.jsonl`, the others to nothing; all stop when the launcher
writes `stop`. An exception goes to `error-<rank>.json`, marked `peer_failure` when it is a
collective broken by another rank's death (the launcher then blames that rank, not this one).
See `trainer.distributed.launch` for the folder's other files.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from trainer.distributed import collectives as distributed
from trainer.sink import NullSink, RecordSink


def main(control: Path) -> int:
    from trainer.loop import train_in_process
    from trainer.models.loading import resolve_device
    from trainer.spec import JobSpec

    job = json.loads((control / "job.json").read_text())
    distributed.init_from_env(resolve_device())
    rank = distributed.rank()
    stop_file = control / "stop"
    try:
        spec = JobSpec.model_validate(job["spec"])
        sink = RecordSink(control / "sink.jsonl") if rank == 0 else NullSink()
        result = train_in_process(spec, sink, stop_file.exists, resume=Path(job["resume"]) if job["resume"] else None,
                       out_dir=Path(job["out_dir"]),
                       dataset_path=Path(job["dataset_path"]) if job["dataset_path"] else None)
        if rank == 0:
            (control / "result.json").write_text(json.dumps(result.to_json()))
        distributed.barrier()  # leave together: a gloo peer torn down mid-exchange aborts
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, which fails the job
        traceback.print_exc()
        (control / f"error-{rank}.json").write_text(json.dumps({
            "type": type(exc).__name__, "message": str(exc), "peer_failure": distributed.is_peer_failure(exc)}))
        return 1
    finally:
        if distributed.active():
            import torch.distributed as dist

            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a C++ thread left by gloo or DCP can abort it ("terminate called
    # without an active exception") after the work is done and reported.
    os._exit(code)
