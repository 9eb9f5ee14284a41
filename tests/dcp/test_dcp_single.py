"""AtomicWriter in one process (torch.distributed not needed): saves, async saves, and the
uses it refuses."""

from __future__ import annotations

import itertools
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.dcp import AtomicWriter  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def state(seed: int) -> dict[str, object]:
    return {"w": torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)), "n": seed}


def loads(path: Path, seed: int) -> bool:
    target = {"w": torch.zeros(8, 4), "n": 0}
    dcp.load(target, checkpoint_id=path, no_dist=True)
    expected = state(seed)
    return torch.equal(target["w"], expected["w"]) and target["n"] == seed


def test_save_and_async_save_in_one_process(ckpts: CheckpointDir) -> None:
    """Without a process group: dcp.save and dcp.async_save through AtomicWriter commit
    verified checkpoints that plain dcp.load reads back exactly."""
    dcp.save(state(1), storage_writer=AtomicWriter(ckpts, 1), no_dist=True)
    future = dcp.async_save(state(2), storage_writer=AtomicWriter(ckpts, 2), no_dist=True)
    future.result()
    assert ckpts.steps() == [1, 2]
    for step in (1, 2):
        ckpt = ckpts.verify(step)
        assert loads(ckpt.path, step)
        assert {".metadata", "__0_0.distcp"} <= {e.path for e in ckpt.manifest.files}


def test_use_collectives_false_is_refused(ckpts: CheckpointDir) -> None:
    """Without collectives there is no coordinator to commit: refused, nothing left behind."""
    with pytest.raises(ValueError, match="use_collectives=True"):
        dcp.save(
            state(1), storage_writer=AtomicWriter(ckpts, 1), no_dist=True, use_collectives=False
        )
    assert ckpts.steps() == []
    assert not ckpts.root.exists() or not [p for p in ckpts.root.iterdir() if "lock" not in p.name]


def test_another_checkpoint_id_is_refused(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """The writer commits to its own step's directory: a different checkpoint_id is an error."""
    with pytest.raises(ValueError, match="do not pass checkpoint_id"):
        dcp.save(
            state(1),
            storage_writer=AtomicWriter(ckpts, 1),
            checkpoint_id=tmp_path / "elsewhere",
            no_dist=True,
        )


def test_the_process_executor_is_refused_by_pickling(ckpts: CheckpointDir) -> None:
    """AsyncCheckpointerType.PROCESS sends the writer to a subprocess by pickling it: the writer
    refuses, with a message saying to use the thread executor."""
    with pytest.raises(TypeError, match="thread executor"):
        pickle.dumps(AtomicWriter(ckpts, 1))


def test_a_bad_on_pending_is_refused(ckpts: CheckpointDir) -> None:
    """on_pending is "wait" or "raise"."""
    with pytest.raises(ValueError, match="on_pending"):
        AtomicWriter(ckpts, 1, on_pending="skip")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("_write_item", "disk full in a writer thread"),  # while a file is open
        ("_write_files_from_queue", "returned no result"),  # before any file is opened
    ],
)
def test_a_write_error_in_one_of_dcps_writer_threads_promotes_nothing(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, where: str, error: str
) -> None:
    """thread_count=2: FileSystemWriter runs the second file's write in a thread of its own and
    drops that thread's exception; the save must still fail, promote nothing and leave no
    staging dir (not publish a checkpoint whose .metadata lacks the lost items)."""
    import threading

    from torch.distributed.checkpoint import filesystem

    from atomic_ckpt import TMP_INFIX

    real = getattr(filesystem, where)
    fired: list[str] = []

    def failing(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is not threading.main_thread():
            if where == "_write_files_from_queue":
                args[1].get_nowait()  # type: ignore[attr-defined]  # takes a file, then fails
            fired.append(threading.current_thread().name)
            raise OSError(28, "disk full in a writer thread, on purpose")
        return real(*args, **kwargs)

    monkeypatch.setattr(filesystem, where, failing)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # torch's thread drops it
    state = {"a": torch.randn(64), "b": torch.randn(64), "c": torch.randn(64)}
    with pytest.raises(BaseException, match=error):
        dcp.save(state, storage_writer=AtomicWriter(ckpts, 1, thread_count=2), no_dist=True)
    assert fired  # the fault fired, in a writer thread
    assert ckpts.steps() == []
    assert not [p for p in ckpts.root.iterdir() if TMP_INFIX in p.name and "lock" not in p.name]


def test_on_pending_raise_right_after_the_future_is_done_does_not_raise(
    ckpts: CheckpointDir,
) -> None:
    """Once the previous async save's future is done, a writer made with on_pending="raise"
    starts: the save is over even if torch's executor thread has not exited yet (here it
    lingers 0.2 s in a done-callback, as it may on a loaded machine)."""
    import threading
    import time

    lingered: list[int] = []

    def linger(_: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            lingered.append(1)
            time.sleep(0.2)

    for step in range(1, 6):
        writer = AtomicWriter(ckpts, step, on_pending="raise")  # never a PendingSaveError
        future = dcp.async_save(state(step), storage_writer=writer, no_dist=True)
        future.add_done_callback(linger)
        future.result()
    assert lingered  # the executor thread did outlive a done future
    assert ckpts.steps() == list(range(1, 6))


def test_writers_made_before_the_previous_async_save_started_still_wait_for_it(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers made up front, then two async saves with cache_staged_state_dict: the
    second waits for the first before it copies into the shared CPU buffers, so step 1
    holds the first state, not the second's bytes."""
    import time

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    def full(value: float) -> dict[str, object]:
        return {"w": torch.full((256,), value)}

    dcp.async_save(
        full(0.0), storage_writer=AtomicWriter(ckpts, 0, cache_staged_state_dict=True), no_dist=True
    ).result()  # the root's CPU buffers now exist
    real = FileSystemWriter.write_data
    slowed: list[int] = []

    def slow_first(self: FileSystemWriter, plan: object, planner: object) -> object:
        if not slowed:
            slowed.append(1)
            time.sleep(0.5)
        return real(self, plan, planner)  # type: ignore[arg-type]

    monkeypatch.setattr(FileSystemWriter, "write_data", slow_first)
    first = AtomicWriter(ckpts, 1, cache_staged_state_dict=True)
    second = AtomicWriter(ckpts, 2, cache_staged_state_dict=True)
    f1 = dcp.async_save(full(1.0), storage_writer=first, no_dist=True)
    f2 = dcp.async_save(full(2.0), storage_writer=second, no_dist=True)
    f1.result()
    f2.result()
    assert slowed  # the first save was still writing when the second was staged
    for step, value in ((1, 1.0), (2, 2.0)):
        target = {"w": torch.zeros(256)}
        dcp.load(target, checkpoint_id=ckpts.path_of(step), no_dist=True)
        assert torch.equal(target["w"], torch.full((256,), value)), step


def test_an_async_save_that_failed_to_stage_is_not_waited_for(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dcp.async_save raised while copying the state (it never started): the next writer of
    the root neither waits its timeout for it nor calls it pending."""
    import time

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    def no_memory(self: FileSystemWriter, state_dict: object) -> object:
        raise MemoryError("staging failed on purpose")

    failed = AtomicWriter(ckpts, 1)  # still referenced, as a trainer's variable would be
    monkeypatch.setattr(FileSystemWriter, "stage", no_memory)
    with pytest.raises(MemoryError, match="on purpose"):
        dcp.async_save(state(1), storage_writer=failed, no_dist=True)
    monkeypatch.undo()
    start = time.monotonic()
    AtomicWriter(ckpts, 2, on_pending="raise")  # not a PendingSaveError
    AtomicWriter(ckpts, 2, timeout=3.0)  # not a wait of 3 s, then CheckpointTimeoutError
    assert time.monotonic() - start < 2.0


def test_an_async_save_that_failed_before_planning_is_not_waited_for(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """dcp.async_save with a checkpoint_id: the background save refuses it at once (its future
    raises); the next writer of the root neither waits its timeout for it nor calls it
    pending."""
    import time

    failed = AtomicWriter(ckpts, 1)  # still referenced, as a trainer's variable would be
    future = dcp.async_save(
        state(1), storage_writer=failed, checkpoint_id=tmp_path / "elsewhere", no_dist=True
    )
    with pytest.raises(ValueError, match="do not pass checkpoint_id"):
        future.result()
    start = time.monotonic()
    AtomicWriter(ckpts, 2, on_pending="raise")  # not a PendingSaveError
    AtomicWriter(ckpts, 2, timeout=3.0)  # not a wait of 3 s, then CheckpointTimeoutError
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    "second",
    [
        {"w": torch.full((4,), 0.1, dtype=torch.float64)},  # another dtype: copy_ would cast
        {"w": torch.full((1,), 0.1)},  # a smaller shape: copy_ would broadcast it
        {"w": torch.full((4,), 0.1), "new": torch.ones(2)},  # another key
    ],
    ids=["dtype", "shape", "key"],
)
def test_cached_staging_buffers_are_reused_only_for_the_same_layout(
    ckpts: CheckpointDir, second: dict[str, torch.Tensor]
) -> None:
    """cache_staged_state_dict: a state whose keys, shapes or dtypes changed since the root's
    last async save gets new buffers, and its checkpoint loads back exactly as it was saved."""
    first = {"w": torch.zeros(4)}
    for step, saved in ((1, first), (2, second)):
        writer = AtomicWriter(ckpts, step, cache_staged_state_dict=True)
        dcp.async_save(saved, storage_writer=writer, no_dist=True).result()
    target = {k: torch.zeros_like(v) for k, v in second.items()}
    dcp.load(target, checkpoint_id=ckpts.path_of(2), no_dist=True)
    assert all(torch.equal(target[k], v) for k, v in second.items())


def test_staging_copies_into_the_cache_like_torch_does_on_several_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy into cached buffers gives what torch's _copy_state_dict gives (the state's
    structure, the cache's tensors filled from the state's, the state's other values), and
    two tensors are copied at the same time (a barrier only two threads can pass)."""
    import os
    import threading

    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    from atomic_ckpt.dcp import _copy as _dcp_copy

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the copy runs on one thread")
    state = {
        "model": {"w": torch.randn(64, 8), "b": torch.arange(5, dtype=torch.int64)},
        "optim": {"state": [torch.ones(3), (torch.zeros(2, dtype=torch.float16), 7)], "lr": 0.1},
        "step": 12,
        "name": "run",
        "none": None,
    }
    cache = _create_cpu_state_dict(state)
    expected = _copy_state_dict(state, _create_cpu_state_dict(state))

    meet = threading.Barrier(2, timeout=10)
    real = _dcp_copy._copy_state_dict
    threads: set[int] = set()

    def together(src: dict[str, Any], dst: dict[str, Any]) -> dict[str, Any]:
        if isinstance(src["t"], torch.Tensor):  # the other values are checked by the caller
            threads.add(threading.get_ident())
            if len(threads) <= 2 and not meet.broken:
                meet.wait()  # raises BrokenBarrierError if the copies ran one after the other
        return real(src, dst)

    monkeypatch.setattr(_dcp_copy, "_copy_state_dict", together)  # where it is looked up
    staged = _dcp_copy._copy_staged(state, cache)

    assert len(threads) >= 2
    assert type(staged["optim"]["state"]) is list
    assert type(staged["optim"]["state"][1]) is tuple
    assert staged["step"] == expected["step"] == 12
    assert staged["name"] is state["name"]
    assert staged["none"] is None
    assert staged["optim"]["lr"] == 0.1
    assert staged["model"]["w"].data_ptr() == cache["model"]["w"].data_ptr()
    assert staged["optim"]["state"][0].data_ptr() == cache["optim"]["state"][0].data_ptr()
    for got, want in (
        (staged["model"]["w"], expected["model"]["w"]),
        (staged["model"]["b"], expected["model"]["b"]),
        (staged["optim"]["state"][0], expected["optim"]["state"][0]),
        (staged["optim"]["state"][1][0], expected["optim"]["state"][1][0]),
    ):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_staging_into_the_cache_refuses_what_dcp_cannot_save(ckpts: CheckpointDir) -> None:
    """A value DCP's own copy refuses (here a bytearray) is refused by the cached copy too,
    as torch refuses it, rather than staged by reference (later changes would be saved)."""
    state = {"w": torch.zeros(4), "extra": bytearray(b"original")}
    writer = AtomicWriter(ckpts, 1, cache_staged_state_dict=True)
    with pytest.raises((ValueError, CheckpointException), match="Unexpected value type"):
        dcp.async_save(state, storage_writer=writer, no_dist=True).result()
    assert ckpts.steps() == []


def _record_writeback(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every start_writeback call as (offset, length, file size then); the real call made."""
    import os

    from atomic_ckpt._core.l2_syscalls import fs as _fs

    calls: list[tuple[int, int, int]] = []
    real = _fs.start_writeback

    def recording(fd: int, offset: int, length: int) -> bool:
        calls.append((offset, length, os.fstat(fd).st_size))
        return real(fd, offset, length)

    monkeypatch.setattr(_fs, "start_writeback", recording)
    # Only the stream's ranges: the whole-file hint before a rank's largest file is hashed
    # (SyncPolicy.start_file, tested in test_commit.py) is left out here.
    monkeypatch.setattr(_fs, "start_file_writeback", lambda *args: False)
    return calls


def test_a_durable_save_starts_each_files_writeback_while_it_is_written(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every WRITEBACK_CHUNK bytes the writer asks the kernel to start writing what DCP has
    written so far (so the fsync after the file waits for the tail only): consecutive ranges
    from offset 0, each already in the file when asked; the checkpoint is unchanged."""
    from atomic_ckpt.dcp import _files as _dcp_files

    monkeypatch.setattr(_dcp_files, "WRITEBACK_CHUNK", 64 << 10)  # where it is read
    calls = _record_writeback(monkeypatch)
    big = {
        f"t{i}": torch.randn(64, 1024, generator=torch.Generator().manual_seed(i)) for i in range(4)
    }
    dcp.save(big, storage_writer=AtomicWriter(ckpts, 1), no_dist=True)

    assert len(calls) >= 4  # 1 MiB of tensors in 64 KiB chunks (some writes are larger)
    assert calls[0][0] == 0
    for (offset, length, _), (next_offset, _, _) in itertools.pairwise(calls):
        assert length >= 64 << 10
        assert next_offset == offset + length
    assert all(offset + length <= size for offset, length, size in calls)
    ckpt = ckpts.verify(1)
    target = {k: torch.zeros_like(v) for k, v in big.items()}
    dcp.load(target, checkpoint_id=ckpt.path, no_dist=True)
    assert all(torch.equal(target[k], v) for k, v in big.items())


def test_a_non_durable_root_starts_no_writeback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """durable=False promises nothing on disk, so the writer does not push data there early
    (while the same save into a durable root does: the patched chunk size is the one read)."""
    from atomic_ckpt.dcp import _files as _dcp_files

    monkeypatch.setattr(_dcp_files, "WRITEBACK_CHUNK", 1)  # where it is read
    calls = _record_writeback(monkeypatch)
    ckpts = CheckpointDir(tmp_path / "fast", durable=False)
    dcp.save(state(1), storage_writer=AtomicWriter(ckpts, 1), no_dist=True)
    assert calls == []
    assert loads(ckpts.verify(1).path, 1)
    durable = CheckpointDir(tmp_path / "durable")
    dcp.save(state(1), storage_writer=AtomicWriter(durable, 1), no_dist=True)
    assert calls  # the control: a durable root's save does start writeback


def test_start_writeback_is_a_hint_that_reports_whether_it_was_taken(tmp_path: Path) -> None:
    """On Linux a regular file's dirty range is handed to the kernel (True); an empty range
    or a pipe is not (False); it never raises."""
    import os
    import sys

    from atomic_ckpt._core.l2_syscalls import fs as _fs

    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * 8192)
        f.flush()
        assert _fs.start_writeback(f.fileno(), 0, 8192) is sys.platform.startswith("linux")
        assert _fs.start_writeback(f.fileno(), 0, 0) is False
    read, write = os.pipe()
    try:
        os.write(write, b"x")
        assert _fs.start_writeback(write, 0, 1) is False
    finally:
        os.close(read)
        os.close(write)


# ---------------------------------------------------------------- stream extensions


class _Zlib:
    """A DCP stream extension compressing with zlib (always installed), registered by name:
    the same mechanism as torch's ZStandard, which needs the zstandard package."""

    @staticmethod
    def make() -> Any:
        import io
        import zlib

        from torch.distributed.checkpoint._extension import StreamTransformExtension

        class Zlib(StreamTransformExtension):
            @staticmethod
            def registry_name() -> str:
                return "stream.zlib@atomic-ckpt-tests"

            @staticmethod
            def from_descriptor(version: str) -> Zlib:
                return Zlib()

            def get_descriptor(self) -> str:
                return f"{self.registry_name()}/1"

            def transform_to(self, output: Any) -> Any:
                class Writer(io.RawIOBase):
                    def __init__(self) -> None:
                        self.z = zlib.compressobj()

                    def writable(self) -> bool:
                        return True

                    def write(self, b: Any) -> int:
                        output.write(self.z.compress(bytes(b)))
                        return len(memoryview(b))

                    def close(self) -> None:
                        if not self.closed:
                            output.write(self.z.flush())
                        super().close()

                return Writer()

            def transform_from(self, input: Any) -> Any:
                return io.BytesIO(zlib.decompress(input.read()))

        return Zlib


def _big_state(seed: int) -> dict[str, object]:
    """A state that compresses well (zeros with a little noise): compression shows on disk."""
    w = torch.zeros(256, 256)
    w[0] = torch.randn(256, generator=torch.Generator().manual_seed(seed))
    return {"w": w, "n": seed}


def test_stream_extensions_pass_through_checksummed_on_disk(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """AtomicWriter(_extensions=[...]) compresses as FileSystemWriter does (the same bytes
    on disk), the manifest's checksums are over the compressed files (verify passes), and
    plain dcp.load with the extension's registry reads the state back bit-exact."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint._extension import ExtensionRegistry

    zlib_ext = _Zlib.make()
    writer = AtomicWriter(ckpts, 3, _extensions=[zlib_ext()])
    dcp.save(_big_state(3), storage_writer=writer, no_dist=True)
    ckpt = ckpts.verify(3)
    plain = tmp_path / "plain"
    dcp.save(
        _big_state(3),
        storage_writer=FileSystemWriter(plain, _extensions=[zlib_ext()]),
        no_dist=True,
    )
    data = [e for e in ckpt.manifest.files if e.path.endswith(".distcp")]
    assert data
    for e in data:
        on_disk = (ckpt.path / e.path).read_bytes()
        assert e.size == len(on_disk) < 256 * 256 * 4 // 4  # compressed, and sized as on disk
        assert on_disk == (plain / e.path).read_bytes()
    registry = ExtensionRegistry()
    registry.register(zlib_ext)
    target = {"w": torch.ones(256, 256), "n": 0}
    dcp.load(target, storage_reader=FileSystemReader(ckpt.path, _extension_registry=registry))
    expected = _big_state(3)
    assert torch.equal(target["w"], expected["w"])
    assert target["n"] == 3


def test_a_zstd_compressed_save_loads_bit_exact_with_plain_dcp_load(ckpts: CheckpointDir) -> None:
    """torch's own ZStandard extension through AtomicWriter (sync and async): the
    checkpoint verifies and plain dcp.load(checkpoint_id=...) reads it back bit-exact."""
    pytest.importorskip("zstandard", reason="ZStandard needs the zstandard package")
    from torch.distributed.checkpoint._extension import ZStandard

    writer = AtomicWriter(ckpts, 1, _extensions=[ZStandard()])
    dcp.save(_big_state(1), storage_writer=writer, no_dist=True)
    writer = AtomicWriter(ckpts, 2, _extensions=[ZStandard()])
    dcp.async_save(_big_state(2), storage_writer=writer, no_dist=True).result()
    for step in (1, 2):
        ckpt = ckpts.verify(step)
        sizes = [e.size for e in ckpt.manifest.files if e.path.endswith(".distcp")]
        assert sizes
        assert sum(sizes) < 256 * 256 * 4 // 4  # compressed on disk
        target = {"w": torch.ones(256, 256), "n": 0}
        dcp.load(target, checkpoint_id=ckpt.path)
        assert torch.equal(target["w"], _big_state(step)["w"])
        assert target["n"] == step


def _safetensors_parts(data: bytes) -> tuple[object, bytes]:
    """A safetensors file as (its parsed header, its tensor bytes)."""
    import json
    import struct

    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


@pytest.mark.parametrize("fmt", ["torch_save", "safetensors"])
def test_serialization_format_passes_through(
    ckpts: CheckpointDir, tmp_path: Path, fmt: str
) -> None:
    """AtomicWriter(serialization_format=...) writes the files FileSystemWriter writes (the
    same bytes) and the checkpoint verifies; torch_save loads back with plain dcp.load, a
    safetensors file with safetensors (torch 2.13's FileSystemReader reads only torch_save)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    if fmt == "safetensors":
        pytest.importorskip("safetensors")
    writer = AtomicWriter(ckpts, 4, serialization_format=SerializationFormat(fmt))
    dcp.save({"w": state(4)["w"]}, storage_writer=writer, no_dist=True)
    ckpt = ckpts.verify(4)
    plain = tmp_path / "plain"
    dcp.save(
        {"w": state(4)["w"]},
        storage_writer=FileSystemWriter(plain, serialization_format=SerializationFormat(fmt)),
        no_dist=True,
    )
    data = [e.path for e in ckpt.manifest.files if e.path.endswith(".distcp")]
    assert data
    for rel in data:
        ours, theirs = (ckpt.path / rel).read_bytes(), (plain / rel).read_bytes()
        if fmt == "safetensors":  # its header's metadata keys come in no fixed order
            ours, theirs = _safetensors_parts(ours), _safetensors_parts(theirs)
        assert ours == theirs
    if fmt == "safetensors":
        from safetensors.torch import load_file

        assert torch.equal(load_file(ckpt.path / data[0])["w"], state(4)["w"])
        return
    target = {"w": torch.zeros(8, 4)}
    dcp.load(target, checkpoint_id=ckpt.path)
    assert torch.equal(target["w"], state(4)["w"])
