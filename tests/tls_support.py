"""A throwaway PKI for the TLS tests, made with the ``openssl`` command line: a CA, a server
certificate for 127.0.0.1/localhost, one for another name (hostname verification must refuse
it), a client certificate (mutual TLS) and an unrelated CA (verification must refuse the
server's certificate against it). Keys are PKCS#8 PEM, which Python's ssl, gRPC and Netty
(Apache RocketMQ) all read."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    #: a certificate of the same CA for ``broker.invalid`` only
    wrong_name_cert: str
    wrong_name_key: str
    client_cert: str
    client_key: str
    #: a CA that signed none of these
    other_ca: str


def _run(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _ca(d: Path, name: str) -> None:
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
         "-days", "2", "-subj", f"/CN=rocketmq-spark test {name}",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, cn: str, san: str, usage: str) -> None:
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={cn}", cwd=d)
    # the key identifiers: Python 3.13's default context checks certificates strictly (VERIFY_X509_STRICT)
    (d / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                                   f"extendedKeyUsage={usage}\nsubjectKeyIdentifier=hash\n"
                                   "authorityKeyIdentifier=keyid,issuer\n"
                                   + (f"subjectAltName={san}\n" if san else ""))
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_pki(d: Path) -> Pki:
    """Write the PKI under ``d`` (a few hundred milliseconds)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests need the openssl command line (apt-get install openssl)")
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "127.0.0.1", "IP:127.0.0.1,DNS:localhost", "serverAuth,clientAuth")
    _leaf(d, "wrong-name", "broker.invalid", "DNS:broker.invalid", "serverAuth")
    _leaf(d, "client", "rocketmq-spark test client", "", "clientAuth")
    p = str(d)
    return Pki(ca=f"{p}/ca.pem", server_cert=f"{p}/server.pem", server_key=f"{p}/server.key",
               wrong_name_cert=f"{p}/wrong-name.pem", wrong_name_key=f"{p}/wrong-name.key",
               client_cert=f"{p}/client.pem", client_key=f"{p}/client.key", other_ca=f"{p}/other-ca.pem")
