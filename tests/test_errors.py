"""One error type: every error gpufeed raises for the user to act on is a GpufeedError (so the
CLI reports it in one line with its exit code) and keeps the built-in base callers catch."""

from __future__ import annotations

import pytest

from gpufeed.advise.measure import MeasureError
from gpufeed.analysis.config import ConfigError
from gpufeed.analysis.run import RunError
from gpufeed.bench.workload import BenchError
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.decode import CorruptImage
from gpufeed.data.packing import PackError
from gpufeed.data.settings import SettingsError
from gpufeed.data.shards import ShardError
from gpufeed.data.workers import LoaderWorkerError
from gpufeed.demo.compare import DemoError, DemoOptionError
from gpufeed.errors import GpufeedError, OptionError
from gpufeed.extras import MissingExtra
from gpufeed.present.kineto import KinetoError
from gpufeed.present.tensorboard import ExportError
from gpufeed.present.trace import TraceError
from gpufeed.profiler.session import ProfileError

ERRORS = {
    ConfigError: ValueError,
    RunError: ValueError,
    DemoError: RuntimeError,
    DemoOptionError: ValueError,
    MeasureError: ValueError,
    SettingsError: ValueError,
    BenchError: ValueError,
    CorruptSampleError: ValueError,
    CorruptImage: ValueError,
    PackError: ValueError,
    ShardError: Exception,
    LoaderWorkerError: RuntimeError,
    MissingExtra: ImportError,
    KinetoError: ValueError,
    ExportError: ValueError,
    TraceError: ValueError,
    ProfileError: ValueError,
    OptionError: ValueError,
}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_is_a_gpufeed_error_and_keeps_its_builtin_base(error: type[Exception]):
    e = error("what is wrong: what to do")
    assert isinstance(e, GpufeedError) and isinstance(e, ERRORS[error])
    assert str(e) == "what is wrong: what to do" and e.exit_code == 2


def test_an_error_can_carry_its_own_exit_code():
    assert ProfileError("no such executable", exit_code=127).exit_code == 127


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_an_error_message_shows_terminal_controls_from_data_as_escapes(error: type[Exception]):
    e = error("shard a.tar, key x\x1b]0;pwned\x07\x1b[2J\u202e: corrupt\nre-pack it")
    assert not any(c in str(e) for c in "\x1b\x07\u202e")
    assert "x\\x1b]0;pwned\\x07\\x1b[2J\\u202e" in str(e) and "\nre-pack it" in str(e)
