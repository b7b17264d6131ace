#!/usr/bin/env python3
"""Reports hand-written source files and functions that have grown too long.

  scripts/check_sizes.py [--max-file N] [--max-function N] [FOLDER ...]

Looks at the git-tracked *.cc, *.h, *.cu and *.py files under each FOLDER
(default: registry tuning_db autotune backends tools python/src), skipping
generated ones, and prints one line per file over --max-file lines (600)
and per function over --max-function lines (120):

  path:line: file is N lines (limit 600)
  path:line: function NAME is N lines (limit 120)

Exit status 1 if there is any, else 0 after printing "sizes ok".

The C++ scanner is a heuristic for Google-style code whose namespaces are
not indented: a function's body opens with a "{" ending a line of its
signature (a line starting at column 0) and closes with a "}" at column 0;
its length counts from the first line of its signature to that brace.
Python functions are `def` bodies, measured by indentation.
"""

import argparse
import os
import re
import subprocess
import sys

DEFAULT_FOLDERS = ["registry", "tuning_db", "autotune", "backends", "tools", "python/src"]
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".py")
GENERATED = re.compile(r"(\.pb\.(h|cc)$|_pb2\.py$|(^|/)generated/)")

# Lines at column 0 that start something other than a function.
NOT_A_FUNCTION = re.compile(
    r"^(namespace\b|extern\b|class\b|struct\b|union\b|enum\b|typedef\b|using\b|#|//|/\*|\*|"
    r"template\s*<[^>]*>\s*(class|struct|union)\b)")
NAME = re.compile(r"((?:[A-Za-z_~][\w]*::)*(?:operator\s*[^\s(]+|~?[A-Za-z_]\w*))\s*\(")


def tracked_files(folders):
    """The git-tracked source files under `folders`, sorted."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--"] + folders, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
        files = [f for f in out.decode("utf-8", "replace").split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder in folders:
            for root, _, names in os.walk(folder):
                files.extend(os.path.join(root, n) for n in names)
    return sorted(f for f in files
                  if f.endswith(SOURCE_SUFFIXES) and not GENERATED.search(f) and os.path.isfile(f))


def strip_comment(line):
    """`line` without a trailing // comment (string contents are not parsed)."""
    at = line.find("//")
    return line if at < 0 else line[:at]


def function_name(signature):
    """The name a C++ signature declares, or None where it is not a function."""
    head = signature.split("{")[0]
    # The name is the last identifier before the parameter list: the "("
    # that closes last at depth 0.
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        c = head[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                found = None
                for m in NAME.finditer(head[:i + 1]):
                    found = m
                if found is not None and found.end() == i + 1:
                    return found.group(1).replace(" ", "")
                return None
    return None


def cc_functions(lines):
    """(line number, name, length) of each function definition in C++ `lines`."""
    found = []
    start = None  # index of the first line of the current signature
    i = 0
    while i < len(lines):
        line = lines[i]
        code = strip_comment(line).rstrip()
        if line[:1] not in ("", " ", "\t", "}", "{", ")") and not NOT_A_FUNCTION.match(line):
            if start is None:
                start = i
        elif not line.strip() or line[:1] == "}" or NOT_A_FUNCTION.match(line):
            start = None
        if start is not None and code.endswith("{") and not code.endswith("= {"):
            signature = " ".join(strip_comment(l).strip() for l in lines[start:i + 1])
            name = function_name(signature) if ("(" in signature and "=" not in signature.split("(")[0]) else None
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            if name is not None:
                found.append((start + 1, name, end - start + 1))
                i = end + 1
                start = None
                continue
            start = None
        elif start is not None and (code.endswith(";") or code.endswith("}")):
            start = None
        i += 1
    return found


def py_functions(lines):
    """(line number, name, length) of each `def` in Python `lines`."""
    found = []
    pattern = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")
    for i, line in enumerate(lines):
        m = pattern.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        last = i
        for j in range(i + 1, len(lines)):
            text = lines[j]
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            if len(text) - len(text.lstrip()) <= indent:
                break
            last = j
        found.append((i + 1, m.group(2), last - i + 1))
    return found


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=DEFAULT_FOLDERS)
    parser.add_argument("--max-file", type=int, default=600, help="most lines a file may have (600)")
    parser.add_argument("--max-function", type=int, default=120, help="most lines a function may have (120)")
    args = parser.parse_args(argv)

    problems = []
    for path in tracked_files(args.folders):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) > args.max_file:
            problems.append(f"{path}:1: file is {len(lines)} lines (limit {args.max_file})")
        functions = py_functions(lines) if path.endswith(".py") else cc_functions(lines)
        for line, name, length in functions:
            if length > args.max_function:
                problems.append(f"{path}:{line}: function {name} is {length} lines (limit {args.max_function})")
    for p in problems:
        print(p)
    if problems:
        return 1
    print("sizes ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
