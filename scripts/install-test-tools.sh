#!/usr/bin/env bash
# Installs everything the test suite talks to, if it is missing:
#   - moto_server, boto3 and the aws CLI in ./.venv (PyPI)
#   - rclone, s3cmd, restic and curl (Debian)
# Safe to run repeatedly; does nothing when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] || [ ! -x .venv/bin/aws ] || ! .venv/bin/python -c 'import boto3' 2>/dev/null; then
  echo "==> installing moto[server], boto3 and awscli into .venv"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check 'moto[server]' boto3 awscli
fi

missing=()
for tool in rclone s3cmd restic curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${missing[*]} from Debian"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
