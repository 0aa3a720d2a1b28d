"""Old import path of `ray_pool` (the Ray pool), kept working: `gpufeed.data.remote` IS the
`gpufeed.data.ray_pool` module, not a copy of its names, so that setting a name through the old
path (a test's monkeypatch of `START_TIMEOUT_S`) reaches the code that reads it."""

import sys

from gpufeed.data import ray_pool

sys.modules[__name__] = ray_pool
