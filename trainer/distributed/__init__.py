"""One job on many ranks: `collectives` (torch.distributed and FSDP2 for the loop), `protocol`
(what the worker and the ranks say to each other, in the attempt's control folder),
`launchers` (the `Launcher` seam) and `local` (torchrun on this node), `launch` (the worker's
side of an attempt, whoever starts the ranks), `rank_main` (each rank's entry point)."""
