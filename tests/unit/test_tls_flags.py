"""The certificate files a worker start writes (resource_managers/workers.py ``tls_flags``) are
replaced whole: each start writes them again while a worker started before may be reading them,
and the loaded suite's docs/security.md snippet had a worker read an empty CA file and exit
("no certificate or crl found")."""

import os
import stat
import threading

from distributed import Security

from pescheduler.resource_managers.workers import tls_flags


def test_a_reader_never_sees_a_certificate_file_partly_written_while_starts_write_it_again(tmp_path):
    security = Security.temporary()
    flags = tls_flags(security, str(tmp_path))
    ca = flags[flags.index("--tls-ca-file") + 1]
    want = security.tls_ca_file
    done, seen = threading.Event(), []

    def starts() -> None:
        for _ in range(3_000):
            tls_flags(security, str(tmp_path))
        done.set()

    writer = threading.Thread(target=starts)
    writer.start()
    while not done.is_set():
        with open(ca) as f:
            text = f.read()
        if text != want:
            seen.append(len(text))
    writer.join(timeout=60)
    assert not seen, f"{len(seen)} reads of the CA file found it partly written ({sorted(set(seen))[:5]} characters)"
    assert sorted(os.listdir(tmp_path)) == ["tls-ca-file.pem", "tls-cert.pem", "tls-key.pem"]   # no temporary left
    assert all(stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600 for name in os.listdir(tmp_path))
