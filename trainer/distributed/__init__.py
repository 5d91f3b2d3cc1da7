"""Starting one job on many ranks: `protocol` (what the worker and the ranks say to each other,
in the attempt's control folder), `launchers` (the `Launcher` seam) and `local` (torchrun on
this node), `launch` (the worker's side of an attempt, whoever starts the ranks), `rank_main`
(each rank's entry point, which runs the loop). What the loop itself calls on every rank
(torch.distributed and FSDP2) is `trainer.collectives`, below the loop: this package is above
it."""
