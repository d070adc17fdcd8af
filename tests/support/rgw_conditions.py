#!/usr/bin/env python3
"""Probes which conditional-write headers an S3 server honours.

    rgw_conditions.py ENDPOINT [ACCESS SECRET]
        Runs the condition matrix against ENDPOINT (path-style, us-east-1,
        default key backend-key / backend-secret-123) and prints one
        markdown table row per probe: what was sent, status, error code.
    rgw_conditions.py tenants ENDPOINT ACCESS1 SECRET1 ACCESS2 SECRET2
        Checks that two users (e.g. in two RGW tenants) creating the same
        bucket name get separate buckets.

A tool for looking at a backend (written for Ceph RGW 16.2 started by
tests/support/ceph-rgw.sh), not a test: it asserts nothing. Needs boto3.
Conditional headers are sent on raw SigV4-signed requests so that exact
header names and values (old `x-amz-copy-if-*` names, bare ETags) go out
as written.
"""

import base64
import hashlib
import http.client
import sys
import time
import urllib.parse
import uuid
import zlib
from email.utils import formatdate
from xml.etree import ElementTree

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

REGION = "us-east-1"


class Client:
    def __init__(self, endpoint, access, secret):
        self.endpoint = endpoint.rstrip("/")
        u = urllib.parse.urlsplit(self.endpoint)
        self.host, self.port = u.hostname, u.port or 80
        self.creds = Credentials(access, secret)
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=Config(
                s3={"addressing_style": "path"},
                signature_version="s3v4",
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"max_attempts": 1},
            ),
        )

    def raw(self, method, path, headers=None, body=b"", sign=True, send_body=None, payload_hash=None):
        """One request; returns (status, error code or '', headers, body).

        The body is signed as `body` (x-amz-content-sha256 = its sha256, or
        `payload_hash` when given); `send_body`, when given, is what
        actually goes on the wire.
        """
        url = self.endpoint + path
        headers = dict(headers or {})
        if sign:
            req = AWSRequest(method=method, url=url, data=body, headers=headers)
            signer = S3SigV4Auth(self.creds, "s3", REGION)
            if payload_hash is not None:
                signer.payload = lambda _request: payload_hash
            signer.add_auth(req)
            headers = dict(req.headers.items())
        wire = body if send_body is None else send_body
        headers["Content-Length"] = str(len(wire))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request(method, path, body=wire, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        code = ""
        if resp.status >= 300 and data:
            try:
                code = ElementTree.fromstring(data).findtext("Code") or ""
            except ElementTree.ParseError:
                pass
        return resp.status, code, {k.lower(): v for k, v in resp.getheaders()}, data


def md5(b):
    return hashlib.md5(b).hexdigest()


def fmt(status, code):
    return f"{status} {code}".strip()


def matrix(c):
    rows = []

    def row(what, result, note=""):
        rows.append((what, result, note))
        print(f"| {what} | {result} | {note} |", flush=True)

    print("| probe | answer | note |\n| --- | --- | --- |")
    bucket = "cond-" + uuid.uuid4().hex[:8]
    c.s3.create_bucket(Bucket=bucket)

    def put(key, body, headers=None):
        st, code, h, _ = c.raw("PUT", f"/{bucket}/{key}", headers, body)
        return st, code, h

    def cur_etag(key):
        st, _, h, _ = c.raw("HEAD", f"/{bucket}/{key}")
        return h.get("etag") if st == 200 else None

    body = b"v1"
    st, code, h = put("k", body, {"x-amz-meta-fencing-token": "42"})
    row("PUT plain", fmt(st, code), f"ETag header {h.get('etag')!r}")
    e = md5(body)
    q = f'"{e}"'
    wrong = md5(b"nope")

    # ---- PUT conditions
    st, code, _ = put("k", b"v2", {"If-None-Match": "*"})
    row("PUT If-None-Match: * on existing key", fmt(st, code), f"key now {cur_etag('k')}")
    st, code, _ = put("new-inm", b"x", {"If-None-Match": "*"})
    row("PUT If-None-Match: * on missing key", fmt(st, code))
    for label, val in [("quoted correct", q), ("bare correct", e), ("quoted wrong", f'"{wrong}"'), ("bare wrong", wrong)]:
        # reset k to body v1 each time so "correct" stays correct
        put("k", body)
        st, code, _ = put("k", b"v3", {"If-Match": val})
        row(f"PUT If-Match {label}", fmt(st, code), f"key now {cur_etag('k')}")
    put("k", body)
    st, code, _ = put("missing-im", b"x", {"If-Match": q})
    row("PUT If-Match (any ETag) on missing key", fmt(st, code), f"key exists after: {cur_etag('missing-im') is not None}")
    st, code, _ = put("k", body, {"If-Match": "*"})
    row("PUT If-Match: * on existing key", fmt(st, code))
    st, code, _ = put("missing-star", b"x", {"If-Match": "*"})
    row("PUT If-Match: * on missing key", fmt(st, code), f"key exists after: {cur_etag('missing-star') is not None}")

    # ---- DELETE
    put("d", b"d")
    st, code, _, _ = c.raw("DELETE", f"/{bucket}/d", {"If-Match": f'"{wrong}"'})
    row("DELETE If-Match wrong (quoted)", fmt(st, code), f"key still there: {cur_etag('d') is not None}")
    put("d", b"d")
    st, code, _, _ = c.raw("DELETE", f"/{bucket}/d", {"If-Match": f'"{md5(b"d")}"'})
    row("DELETE If-Match correct (quoted)", fmt(st, code), f"key still there: {cur_etag('d') is not None}")

    # ---- CopyObject: destination conditions
    src = f"/{bucket}/k"
    put("dst", b"old")
    dq = f'"{md5(b"old")}"'

    def copy(headers, dst="dst"):
        hdrs = {"x-amz-copy-source": src}
        hdrs.update(headers)
        st, code, h, data = c.raw("PUT", f"/{bucket}/{dst}", hdrs)
        return st, code, data

    st, code, _ = copy({"If-None-Match": "*"})
    row("Copy dest If-None-Match: * onto existing", fmt(st, code), f"dst now {cur_etag('dst')}")
    put("dst", b"old")
    st, code, _ = copy({"If-Match": f'"{wrong}"'})
    row("Copy dest If-Match wrong", fmt(st, code), f"dst now {cur_etag('dst')}")
    put("dst", b"old")
    st, code, _ = copy({"If-Match": dq})
    row("Copy dest If-Match correct", fmt(st, code), f"dst now {cur_etag('dst')}")

    # ---- CopyObject: source conditions, new and old header names
    past = formatdate(time.time() - 86400, usegmt=True)
    future = formatdate(time.time() + 86400, usegmt=True)
    for prefix in ("x-amz-copy-source-if-", "x-amz-copy-if-"):
        cases = [
            ("match", f'"{wrong}"', "wrong quoted"),
            ("match", wrong, "wrong bare"),
            ("match", q, "right quoted"),
            ("match", e, "right bare"),
            ("none-match", q, "right quoted"),
            ("none-match", e, "right bare"),
            ("none-match", f'"{wrong}"', "wrong quoted"),
            ("modified-since", future, "future"),
            ("modified-since", past, "past"),
            ("unmodified-since", past, "past"),
            ("unmodified-since", future, "future"),
        ]
        for cond, val, label in cases:
            put("dst", b"old")
            st, code, data = copy({prefix + cond: val})
            note = ""
            if st == 200:
                et = ElementTree.fromstring(data).findtext("{*}ETag")
                note = f"copied; result ETag {et!r}"
            row(f"Copy {prefix}{cond} {label}", fmt(st, code), note)

    # ---- UploadPartCopy
    mp = c.s3.create_multipart_upload(Bucket=bucket, Key="mpc")["UploadId"]
    for name in ("x-amz-copy-source-if-match", "x-amz-copy-if-match"):
        st, code, _, _ = c.raw(
            "PUT",
            f"/{bucket}/mpc?partNumber=1&uploadId={urllib.parse.quote(mp)}",
            {"x-amz-copy-source": src, name: f'"{wrong}"'},
        )
        row(f"UploadPartCopy {name} wrong", fmt(st, code))
    c.s3.abort_multipart_upload(Bucket=bucket, Key="mpc", UploadId=mp)

    # ---- CompleteMultipartUpload conditions
    def complete(headers):
        up = c.s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
        part = c.s3.upload_part(Bucket=bucket, Key="k", UploadId=up, PartNumber=1, Body=b"mp-body")
        xml = (
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
            f"<ETag>{part['ETag']}</ETag></Part></CompleteMultipartUpload>"
        ).encode()
        st, code, _, data = c.raw("POST", f"/{bucket}/k?uploadId={urllib.parse.quote(up)}", headers, xml)
        if st >= 300:
            try:
                c.s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=up)
            except Exception:
                pass
        return st, code, data

    put("k", body)
    st, code, _ = complete({"If-None-Match": "*"})
    row("Complete If-None-Match: * onto existing", fmt(st, code), f"key now {cur_etag('k')}")
    put("k", body)
    st, code, _ = complete({"If-Match": f'"{wrong}"'})
    row("Complete If-Match wrong", fmt(st, code), f"key now {cur_etag('k')}")
    put("k", body)
    st, code, data = complete({})
    et = ElementTree.fromstring(data).findtext("{*}ETag") if st == 200 else None
    row("Complete plain", fmt(st, code), f"result ETag {et!r}")

    # ---- ETag quoting, metadata, listing, bulk delete, anonymous
    put("k", body, {"x-amz-meta-fencing-token": "42"})
    r = c.s3.put_object(Bucket=bucket, Key="q", Body=b"q")
    row("ETag quoted in PUT answer", str(r["ResponseMetadata"]["HTTPHeaders"]["etag"]))
    hd = c.s3.head_object(Bucket=bucket, Key="k")
    row("ETag quoted in HEAD answer", hd["ResponseMetadata"]["HTTPHeaders"]["etag"])
    cp = c.s3.copy_object(Bucket=bucket, Key="k2", CopySource={"Bucket": bucket, "Key": "k"})
    row("ETag quoted in Copy answer", cp["CopyObjectResult"]["ETag"])
    row("x-amz-meta-fencing-token round trip (HEAD)", repr(hd["Metadata"]))
    row("x-amz-meta-fencing-token on copy (default COPY directive)",
        repr(c.s3.head_object(Bucket=bucket, Key="k2")["Metadata"]))
    keys = sorted(o["Key"] for o in c.s3.list_objects_v2(Bucket=bucket).get("Contents", []))
    row("ListObjectsV2", "200", f"keys {keys}")
    d = c.s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k2"}, {"Key": "q"}]})
    row("DeleteObjects (POST ?delete)", str(d["ResponseMetadata"]["HTTPStatusCode"]),
        f"deleted {sorted(x['Key'] for x in d.get('Deleted', []))}, errors {d.get('Errors', [])}")
    st, code, _, _ = c.raw("GET", f"/{bucket}/k", sign=False)
    row("anonymous GET object", fmt(st, code))
    st, code, _, _ = c.raw("PUT", f"/{bucket}/anon", body=b"x", sign=False)
    row("anonymous PUT object", fmt(st, code))
    st, code, _, _ = c.raw("GET", f"/{bucket}", sign=False)
    row("anonymous list", fmt(st, code))

    # ---- integrity headers
    bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    st, code, _, _ = c.raw("PUT", f"/{bucket}/md5", {"Content-MD5": bad_md5}, b"payload")
    row("PUT Content-MD5 wrong", fmt(st, code), f"key exists after: {cur_etag('md5') is not None}")
    st, code, _, _ = c.raw("PUT", f"/{bucket}/sha", {}, b"payload", send_body=b"PAYLOAD")
    row("PUT x-amz-content-sha256 mismatching body", fmt(st, code), f"key exists after: {cur_etag('sha') is not None}")

    st, code, _, _ = c.raw("PUT", f"/{bucket}/unsigned", {}, b"payload", payload_hash="UNSIGNED-PAYLOAD")
    row("PUT x-amz-content-sha256: UNSIGNED-PAYLOAD", fmt(st, code))
    data = b"payload"
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    chunked = b"%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n" % (len(data), data, crc.encode())
    st, code, _, _ = c.raw(
        "PUT",
        f"/{bucket}/trailer",
        {
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32",
        },
        chunked,
        payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    )
    got = c.s3.get_object(Bucket=bucket, Key="trailer")["Body"].read() if st == 200 else None
    row("PUT aws-chunked STREAMING-UNSIGNED-PAYLOAD-TRAILER (crc32 trailer)", fmt(st, code), f"stored body {got!r}")

    # cleanup
    for o in c.s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        c.s3.delete_object(Bucket=bucket, Key=o["Key"])
    c.s3.delete_bucket(Bucket=bucket)
    return rows


def tenants(endpoint, a1, s1, a2, s2):
    ca, cb = Client(endpoint, a1, s1), Client(endpoint, a2, s2)
    name = "shared-bucket"  # "b" alone is an InvalidBucketName (< 3 chars)
    ca.s3.create_bucket(Bucket=name)
    ca.s3.put_object(Bucket=name, Key="from-a", Body=b"a")
    try:
        cb.s3.create_bucket(Bucket=name)
        created = "created"
    except Exception as e:  # noqa: BLE001
        created = f"create failed: {e}"
    lb = cb.s3.list_objects_v2(Bucket=name).get("Contents", []) if created == "created" else None
    la = ca.s3.list_objects_v2(Bucket=name).get("Contents", [])
    print(f"user B create bucket {name!r}: {created}")
    print(f"user B sees keys: {None if lb is None else [o['Key'] for o in lb]}")
    print(f"user A sees keys: {[o['Key'] for o in la]}")
    print(f"user A ListBuckets: {[b['Name'] for b in ca.s3.list_buckets()['Buckets']]}")
    print(f"user B ListBuckets: {[b['Name'] for b in cb.s3.list_buckets()['Buckets']]}")
    isolated = created == "created" and lb == [] and [o["Key"] for o in la] == ["from-a"]
    print("isolated" if isolated else "NOT isolated")
    return 0 if isolated else 1


def main(argv):
    if len(argv) >= 2 and argv[1] == "tenants" and len(argv) == 7:
        return tenants(*argv[2:])
    if len(argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    access, secret = (argv[2], argv[3]) if len(argv) == 4 else ("backend-key", "backend-secret-123")
    matrix(Client(argv[1], access, secret))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
