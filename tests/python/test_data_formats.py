"""Parquet inputs are tokenized in bounded memory (docs/data.md, "Parquet"): the peak heap
(RssAnon) of kiln-tokenize over a Parquet file 10x larger, with 10x the row groups, grows by far
less than the extra data, which it would hold if the file or the column were read whole.
Reference: the files pyarrow writes and the kernel's own accounting (/proc/PID/status).

Slow (writes ~330 MB, about a minute on 2 cores): runs with KILN_SLOW_TESTS=1.
"""
import os
import subprocess
import time

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")

DOC = 4000  # bytes per document
ROWS_PER_GROUP = 500


def write_parquet(path, mb):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    rows = mb * 1_000_000 // DOC
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())]), compression="snappy") as w:
        for start in range(0, rows, ROWS_PER_GROUP):
            k = min(ROWS_PER_GROUP, rows - start)
            buf = letters[rng.integers(0, len(letters), size=k * DOC)].tobytes().decode()
            w.write_table(pa.table({"text": [buf[i * DOC:(i + 1) * DOC] for i in range(k)]}))
    return rows


def peak_anon_mib(cmd, timeout=300):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        if time.monotonic() > deadline:  # never leave it running: kill by PID, then fail
            p.kill()
            p.communicate()
            raise AssertionError(f"{cmd[0]} ran past {timeout} s")
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) // 1024)
        except OSError:
            pass
        time.sleep(0.01)
    out, err = p.communicate()
    assert p.returncode == 0, err
    return peak, out


def test_parquet_tokenizes_in_bounded_memory(kiln_bin, tmp_path):
    peaks = {}
    for mb in (30, 300):
        src = tmp_path / f"c{mb}.parquet"
        rows = write_parquet(src, mb)
        peak, out = peak_anon_mib([str(kiln_bin("kiln-tokenize")), "--tokenizer", "byte", "--input", str(src),
                                   "--output", str(tmp_path / f"out{mb}"), "--threads", "2", "--no-progress"])
        assert f"{rows:,} documents" in out
        peaks[mb] = peak
        src.unlink()
    print("peak RssAnon MiB:", peaks)
    # 270 MB more text: a reader holding the file or the column would add at least that much.
    assert peaks[300] - peaks[30] < 64, peaks
