#!/usr/bin/env bash
# Certificates for replication over mutual TLS (--repl-tls-cert, --repl-tls-key,
# --repl-tls-ca; docs/operations.md, "Replication over TLS"), with the openssl tool:
#
#   scripts/repl-certs.sh DIR NODE...
#
# makes, in DIR (created 0700 if absent):
#   ca.crt, ca.key      the cluster's CA (EC P-256, 10 years), made once: kept if present
#   NODE.crt, NODE.key  each node's certificate, signed by the CA and naming the node id
#                       (subjectAltName DNS:NODE and CN=NODE), good as a TLS server (a
#                       leader) and as a TLS client (a standby); the key mode 0600
# CERT_DAYS (default 825) sets the node certificates' lifetime. Copy to each node its own
# NODE.crt and NODE.key and ca.crt, never ca.key: whoever holds ca.key can make a
# certificate for any node id (keep it offline). A node id is its --ha-node.
set -euo pipefail
if (($# < 2)); then
  echo "usage: scripts/repl-certs.sh DIR NODE..." >&2
  exit 2
fi
dir=$1
shift
days=${CERT_DAYS:-825}
umask 077
mkdir -p "$dir"
if [[ ! -f $dir/ca.crt ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=hf3fs-metad replication CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
for node in "$@"; do
  if [[ ! $node =~ ^[A-Za-z0-9._-]{1,64}$ ]]; then
    echo "repl-certs: $node is not a node id (1-64 of A-Za-z0-9._-)" >&2
    exit 2
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$node" \
    -keyout "$dir/$node.key" -out "$dir/$node.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=DNS:$node" >"$dir/$node.ext"
  openssl x509 -req -in "$dir/$node.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -sha256 -extfile "$dir/$node.ext" -out "$dir/$node.crt" \
    2>/dev/null
  rm -f "$dir/$node.csr" "$dir/$node.ext"
  chmod 600 "$dir/$node.key"
  chmod 644 "$dir/$node.crt" "$dir/ca.crt"
done
