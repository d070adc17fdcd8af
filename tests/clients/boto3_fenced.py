"""Every fenced write through the proxy with boto3: missing token -> 428,
stale token -> 409 with Fencing-Max-Token, current token -> accepted.

Usage: boto3_fenced.py PROXY_URL BUCKET ACCESS_KEY SECRET_KEY STALE_TOKEN CURRENT_TOKEN
Exits non-zero with a message on the first wrong answer.
"""
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

url, bucket, ak, sk, stale, current = sys.argv[1:7]
s3 = boto3.client(
    "s3",
    endpoint_url=url,
    aws_access_key_id=ak,
    aws_secret_access_key=sk,
    region_name="us-east-1",
    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
)

token = {"value": None}


def add_token(request, **_):
    if token["value"] is not None:
        request.headers["Fencing-Token"] = token["value"]


s3.meta.events.register("before-sign.s3.*", add_token)


def expect(name, status, code, call):
    """Runs call() with no token / stale / current per `status`."""
    try:
        result = call()
    except ClientError as e:
        got = (e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"])
        if got != (status, code):
            sys.exit(f"{name}: expected {status} {code}, got {got}")
        if code == "FencingTokenStale":
            max_token = e.response["ResponseMetadata"]["HTTPHeaders"].get("fencing-max-token")
            if max_token is None:
                sys.exit(f"{name}: 409 without Fencing-Max-Token")
        return None
    if status != 200:
        sys.exit(f"{name}: expected {status} {code}, but it was accepted")
    # DeleteObjects answers 200 and lists per-key failures in Errors.
    if isinstance(result, dict) and result.get("Errors"):
        sys.exit(f"{name}: accepted, but with per-key errors {result['Errors']}")
    return result


def each(name, call):
    token["value"] = None
    expect(f"{name} without token", 428, "FencingTokenRequired", call)
    token["value"] = stale
    expect(f"{name} with a stale token", 409, "FencingTokenStale", call)
    token["value"] = current
    return expect(f"{name} with the current token", 200, None, call)


each("PutObject", lambda: s3.put_object(Bucket=bucket, Key="b3/src", Body=b"source"))
each("CopyObject", lambda: s3.copy_object(Bucket=bucket, Key="b3/copy", CopySource=f"{bucket}/b3/src"))
each("DeleteObject", lambda: s3.delete_object(Bucket=bucket, Key="b3/copy"))
each(
    "DeleteObjects",
    lambda: s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "b3/src"}]}),
)
up = each("CreateMultipartUpload", lambda: s3.create_multipart_upload(Bucket=bucket, Key="b3/mpu"))
upload_id = up["UploadId"]
token["value"] = None  # parts and Complete use the token bound at Create
part = s3.upload_part(Bucket=bucket, Key="b3/mpu", UploadId=upload_id, PartNumber=1, Body=b"p" * 1024)
s3.complete_multipart_upload(
    Bucket=bucket,
    Key="b3/mpu",
    UploadId=upload_id,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
)
head = s3.head_object(Bucket=bucket, Key="b3/mpu")
expected = current.split(":")[2] if current.startswith("fgt1:") else current
if head["Metadata"].get("fencing-token") != expected:
    sys.exit(f"multipart object carries token {head['Metadata']} instead of {expected}")
token["value"] = current
up = s3.create_multipart_upload(Bucket=bucket, Key="b3/aborted")
token["value"] = None
s3.abort_multipart_upload(Bucket=bucket, Key="b3/aborted", UploadId=up["UploadId"])
print("boto3: every fenced write behaved")
