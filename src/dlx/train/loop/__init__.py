"""The step loop and what it writes per step: `trainer` (`pretrain`, `train_loop`), `accumulate` (the micro-steps),
`skipped` (an update not applied), `saving` (a checkpoint as the loop takes it), `records` (log and eval records),
`eval` (validation loss and bits per byte), `finish` (the last checkpoint and eval, the verdict, report.md)."""
