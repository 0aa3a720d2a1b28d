"""SHOW: render what analyze produced: terminal summary (terminal), self-contained HTML report
(html + templates/), Perfetto/Chrome trace (trace, kineto to merge into a torch.profiler trace),
TensorBoard export (tensorboard); numbers formatted once for all of them (numbers)."""
