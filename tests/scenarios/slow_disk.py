"""Input-bound with no workers: the training process 'reads' each sample itself (slow_data.py's
8-ms sleep, like slow storage), so it waits asleep, not on a CPU: storage advice, not CPU advice."""

from __future__ import annotations

from slow_data import main

if __name__ == "__main__":
    main(num_workers=0)
