#!/usr/bin/env python3
"""Fails when a locked dependency of a workspace crate declares a newer `rust-version` than
the crate does: the metadata would promise a toolchain the build refuses.

Reads `cargo metadata --locked --all-features`, follows each workspace crate's normal and
build dependencies through the lockfile's resolve (dev-dependencies build only the crate's
own tests and benches, not what a user compiles), and compares versions. Prints the newest
requirement found and who declares it.

usage: check_rust_version.py   (from the workspace root)"""
import json
import subprocess
import sys


def version(text):
    return tuple(int(part) for part in text.split("."))


def main():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"],
        check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    failed = False
    for member in meta["workspace_members"]:
        crate = packages[member]
        declared = crate.get("rust_version")
        if not declared:
            print(f"{crate['name']}: no rust-version declared")
            failed = True
            continue
        seen, stack = set(), [member]
        while stack:
            node = nodes[stack.pop()]
            for dep in node["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds <= {"dev"} or dep["pkg"] in seen:
                    continue
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])
        needs = [
            (version(packages[p]["rust_version"]), packages[p]["name"], packages[p]["version"])
            for p in seen
            if packages[p].get("rust_version")
        ]
        newest = max(needs) if needs else ((0,), "nothing", "")
        shown = ".".join(map(str, newest[0]))
        if newest[0] > version(declared):
            print(f"{crate['name']}: rust-version {declared}, but {newest[1]} {newest[2]} needs {shown}")
            failed = True
        else:
            print(f"{crate['name']}: rust-version {declared}; newest need among {len(seen)} locked dependencies: {shown} ({newest[1]} {newest[2]})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
