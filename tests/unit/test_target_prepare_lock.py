"""prepare_target is safe to call from several processes at once (a collection and a training job started
together once raced on the shared .partial folder and one died with FileExistsError)."""
import threading
import time

from vllm_dflash import target


def test_concurrent_prepare_converts_once(tmp_path, monkeypatch):
    calls = []

    def fake_convert(out, dtype):
        calls.append(out)
        time.sleep(0.3)  # long enough for the other callers to arrive while this one holds the lock
        out.mkdir(parents=True)
        (out / target._MARKER).write_text("ok\n")
        return out

    monkeypatch.setattr(target, "_convert", fake_convert)
    out = tmp_path / "cache" / "SmolLM2"  # the parent does not exist yet either
    results, errors = [], []

    def worker():
        try:
            results.append(target.prepare_target(out, dtype="float32"))
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [out] * 4
    assert len(calls) == 1, f"the target was converted {len(calls)} times; the lock should make it once"
    assert target.is_prepared(out)
