"""`Run`: a run directory as pandas frames. THE SCHEMA BELOW IS A CONTRACT between profile, analyze and present.

Frames (all times are float seconds since the Unix epoch; sizes in bytes; rates per second):

``system``    columns: time, host, metric, device, value
    metric                     device        value
    cpu.util                   ""            whole-host CPU busy %, 0-100
    cpu.core                   "0".."N-1"    per-core busy %, 0-100
    cpu.iowait                 ""            % of CPU time in iowait, 0-100
    mem.used / mem.total       ""            host memory bytes
    disk.read / disk.write     ""            bytes/s, all disks
    net.rx / net.tx            ""            bytes/s, all interfaces except loopback
    gpu.util                   "0".."G-1"    SM utilization %, 0-100 (NVML)
    gpu.mem_util               "0".."G-1"    memory-controller utilization %
    gpu.mem_used / gpu.mem_total  "0"..      bytes
    gpu.power                  "0"..         watts
    gpu.sm_clock               "0"..         MHz
    gpu.pcie_rx / gpu.pcie_tx  "0"..         bytes/s
    GPU rows exist only where NVML reported them; nothing is ever invented.

``steps``     columns: host, rank, local_rank, pid, step, start, end, duration, data_wait, samples, gpu_time
    One row per training step per rank. A step spans from the end of the previous step (or the first
    batch request) to the end of its optimizer step, so ``duration`` INCLUDES ``data_wait`` (seconds
    the step spent blocked on the DataLoader iterator). ``samples``: leading dim of the batch (NaN
    if unknown). ``gpu_time``: seconds of GPU work from CUDA events (NaN on CPU). ``rank`` is 0 for
    single-process runs.

``processes`` columns: time, host, pid, role, cpu, rss
    role in {"main", "worker", "other"}: "main" = a training process (one per rank),
    "worker" = a DataLoader worker, "other" = anything else in the tree. cpu = % of one core
    (can exceed 100), rss bytes.

``meta`` dict: name, command (list[str], secrets redacted), start_time, end_time, exit_code,
    interval, hosts (list[str]), cpu_count, cpu_model, gpus (list of {index, name, memory_total}),
    gpu_unavailable (str reason, absent when GPUs were read), versions (dict), dropped_events (int),
    ranks (list of {host, rank, local_rank, world_size, pid, start, end}: process start/end per
    training process, for the initialization and finalization phases).
"""
