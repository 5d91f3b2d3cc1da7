"""What a launcher runs on each rank: `python -m trainer.distributed.rank_main <control folder>`.

Joins the process group (torch.distributed's environment, set by whoever started the rank),
then runs the ordinary loop (`trainer.loop.train_in_process`) on the job in the control folder
(`trainer.distributed.protocol`): rank 0 reports to `sink.jsonl` and writes `result.json`, the
others report nothing; all stop when the worker writes `stop`. An exception goes to
`error-<rank>.json`, marked `peer_failure` when it is a collective broken by another rank's
death (the worker then blames that rank, not this one). Nothing here knows the launcher.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from trainer import collectives as distributed
from trainer.distributed.protocol import ControlFolder, ErrorReport


def main(control_path: Path) -> int:
    from trainer.loop import train_in_process
    from trainer.models.loading import resolve_device

    control = ControlFolder(control_path)
    distributed.init_from_env(resolve_device())
    rank = distributed.rank()
    try:
        job = control.read_job()  # a spec that does not validate here is reported like any error
        result = train_in_process(job.spec, control.rank_sink(rank), control.stop_requested, resume=job.resume,
                                  out_dir=job.out_dir, dataset_path=job.dataset_path, start_from=job.start_from)
        if rank == 0:
            control.write_result(result)
        distributed.barrier()  # leave together: a gloo peer torn down mid-exchange aborts
    except Exception as exc:  # noqa: BLE001 - reported to the worker, which fails the job
        traceback.print_exc()
        control.write_error(rank, ErrorReport.of(exc, distributed.is_peer_failure(exc)))
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
