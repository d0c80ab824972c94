"""Everything a run does besides its steps, behind one interface: `base` (`Observer`, `RunView`, `ObserverList`),
`build` (`build_observers`, the one builder: GPU counters, profiler, W&B), `attention` (the kernel chosen before step
1), `sample` (text samples), `tasks` (lm-eval tasks in the loop), `spikes` (the spike guard: it decides; the run folder
rewinds)."""
