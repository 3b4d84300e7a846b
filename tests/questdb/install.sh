#!/usr/bin/env bash
# Installs the QuestDB server the trajectory store's tests and `aware bench store` run: the
# `org.questdb:questdb` jar from Maven Central (the server's main class `io.questdb.ServerMain`
# with its native libraries for linux x86_64; it runs on Java 17), fetched with Maven into
# $HOME/.cache/aware-rs/questdb-<version>/ and checked against Maven's .sha1 and the checksum
# pinned here. Idempotent: a completed install is reused at once.
#
# Prints the jar's path on its last line. The version must match `QUESTDB_VERSION` in
# stores/src/testkit.rs (a test checks it).
set -euo pipefail

version="9.3.4"
sha1="4576dfb8e7f62a01a8e816d3bdf02ea4d39e3e7a"

dir="$HOME/.cache/aware-rs/questdb-$version"
jar="$dir/questdb-$version.jar"
if [ -f "$dir/.complete" ] && [ -f "$jar" ]; then
  echo "$jar"
  exit 0
fi

command -v java >/dev/null 2>&1 || { echo "questdb: java (17 or newer) is not on PATH" >&2; exit 1; }
command -v mvn >/dev/null 2>&1 || { echo "questdb: mvn is not on PATH" >&2; exit 1; }

echo "installing QuestDB $version into $dir" >&2
tmp="$(mktemp -d "${TMPDIR:-/tmp}/aware-questdb.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# --strict-checksums: Maven refuses a download whose .sha1 does not match.
mvn -B -q -Dstyle.color=never --strict-checksums dependency:copy \
  -Dartifact="org.questdb:questdb:$version:jar" -DoutputDirectory="$tmp" >&2

got="$(sha1sum "$tmp/questdb-$version.jar" | cut -d' ' -f1)"
local_repo="$(mvn -B -q -Dstyle.color=never help:evaluate -Dexpression=settings.localRepository -DforceStdout 2>/dev/null || true)"
[ -n "$local_repo" ] || local_repo="$HOME/.m2/repository"
maven_sha1_file="$local_repo/org/questdb/questdb/$version/questdb-$version.jar.sha1"
if [ -f "$maven_sha1_file" ]; then
  maven_sha1="$(cut -c1-40 "$maven_sha1_file")"
  if [ "$got" != "$maven_sha1" ]; then
    echo "questdb: sha1 $got of the jar is not Maven Central's $maven_sha1" >&2
    exit 1
  fi
fi
if [ "$got" != "$sha1" ]; then
  echo "questdb: sha1 $got of questdb-$version.jar is not the pinned $sha1" >&2
  exit 1
fi

mkdir -p "$dir"
mv "$tmp/questdb-$version.jar" "$jar"
touch "$dir/.complete"
echo "$jar"
