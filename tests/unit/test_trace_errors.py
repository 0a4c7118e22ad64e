# SPDX-License-Identifier: Apache-2.0
"""DFLASH_TRACE never stops serving and never fills the disk: a write error turns the trace off with one warning
(the step goes on), and a file that reaches the size cap is rotated to `<name>.1`.

Regression (issue 51 item 7, review L-2/N-3): `StepTrace.flush` let the OSError of a removed folder or a full disk
out of `record()`, which runs inside the drafter's step (the engine core died), and the file grew without bound."""
import logging
import shutil

from vllm_dflash.adaptive import trace as T


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _capture():
    h = _Warnings()
    T.logger.addHandler(h)
    return h


def test_a_removed_folder_turns_the_trace_off_with_one_warning(tmp_path):
    """The folder goes away under a running trace: record() never raises, one warning names the file, and the trace
    stays off (no retries, no more warnings)."""
    folder = tmp_path / "trace"
    st = T.StepTrace(folder / "trace-1.jsonl", flush_every=4)
    for i in range(4):
        st.record(step=i)
    assert len(T.read_trace(st.path)) == 4
    shutil.rmtree(folder)
    h = _capture()
    try:
        for i in range(12):  # three flushes' worth
            st.record(step=i)
        st.flush()
    finally:
        T.logger.removeHandler(h)
    assert not st.enabled and len(h.messages) == 1 and "trace-1.jsonl" in h.messages[0]
    assert not folder.exists()


def test_a_full_disk_turns_the_trace_off(tmp_path, monkeypatch):
    st = T.StepTrace(tmp_path / "trace-1.jsonl", flush_every=2)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("builtins.open", full)
    h = _capture()
    try:
        for i in range(6):
            st.record(step=i)
    finally:
        T.logger.removeHandler(h)
    assert not st.enabled and len(h.messages) == 1 and "No space left" in h.messages[0]


def test_the_file_is_rotated_at_the_cap(tmp_path):
    """With a 2 KiB cap: the live file and its one rotated copy each stay under the cap, the newest records are in
    the live file, and nothing else is written."""
    st = T.StepTrace(tmp_path / "trace-1.jsonl", flush_every=1, max_bytes=2048)
    for i in range(400):
        st.record(step=i, pad="x" * 20)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace-1.jsonl", "trace-1.jsonl.1"]
    assert all((tmp_path / f).stat().st_size <= 2048 for f in files)
    assert T.read_trace(st.path)[-1]["step"] == 399


def test_the_cap_setting_reaches_the_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TRACE", str(tmp_path / "t"))
    monkeypatch.setenv("DFLASH_TRACE_MAX_MB", "0.5")
    st = T.open_trace()
    assert st is not None and st.max_bytes == 512 * 1024


def test_an_unusable_trace_folder_gives_no_trace(tmp_path, monkeypatch):
    """DFLASH_TRACE naming a path under a file: open_trace() warns and returns None instead of raising."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("DFLASH_TRACE", str(tmp_path / "a_file" / "sub"))
    h = _capture()
    try:
        assert T.open_trace() is None
    finally:
        T.logger.removeHandler(h)
    assert len(h.messages) == 1
