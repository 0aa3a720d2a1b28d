"""A slow start: 25 s of 'dataset indexing' before the first step, then the healthy loop."""

from __future__ import annotations

import time

import healthy


def main() -> None:
    time.sleep(25)
    healthy.main()


if __name__ == "__main__":
    main()
