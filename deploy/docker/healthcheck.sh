#!/usr/bin/env bash
# Container health check without curl in the image: bash's /dev/tcp.
#   dragon-healthcheck http PORT PATH   an HTTP GET on 127.0.0.1:PORT answers 200
#   dragon-healthcheck tcp PORT         127.0.0.1:PORT accepts a connection
set -euo pipefail

usage() {
  echo "usage: ${0##*/} http PORT PATH | tcp PORT" >&2
  exit 2
}

mode=${1:-}
port=${2:-}
[[ $port =~ ^[0-9]+$ ]] || usage
case $mode in
  tcp)
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    ;;
  http)
    path=${3:-}
    [[ $path == /* ]] || usage
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
    read -r -t 5 _ status _ <&3 || exit 1
    [[ $status == 200 ]]
    ;;
  *) usage ;;
esac
