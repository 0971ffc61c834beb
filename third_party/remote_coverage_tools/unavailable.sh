#!/bin/sh
echo "bazel coverage is not available in this offline workspace" >&2
exit 1
