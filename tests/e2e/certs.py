"""Certificate authorities and certificates for the TLS tests (Python
`cryptography`): good for localhost and 127.0.0.1, for server and client
authentication, written the way cert-manager updates a Secret volume (a new
file renamed over the old one)."""

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def write_atomic(path, data):
    tmp = f"{path}.tmp-write"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class Ca:
    def __init__(self, cn="mira test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def pem(self):
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path):
        write_atomic(path, self.pem())
        return str(path)

    def leaf(self, cn, expired=False, dns=()):
        """(certificate PEM, key PEM, certificate DER); good for localhost,
        127.0.0.1 and the names in `dns` (wildcards allowed)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = ((now - datetime.timedelta(days=20), now - datetime.timedelta(days=10)) if expired
                      else (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=10)))
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in ("localhost", *dns)] + [
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem, cert.public_bytes(serialization.Encoding.DER)

    def write_leaf(self, dir, stem, cn, expired=False):
        """Writes DIR/STEM.key then DIR/STEM.crt; returns (cert path, key path, DER)."""
        cert, key, der = self.leaf(cn, expired)
        c, k = os.path.join(dir, f"{stem}.crt"), os.path.join(dir, f"{stem}.key")
        write_atomic(k, key)
        write_atomic(c, cert)
        return c, k, der
