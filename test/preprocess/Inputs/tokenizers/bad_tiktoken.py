#!/usr/bin/env python3
"""Writes a broken copy of tiktoken.json for the error tests.

usage: bad_tiktoken.py KIND OUT
"""
import base64
import json
import os
import sys

kind, out = sys.argv[1:3]
v = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiktoken.json")))
if kind == "rank":
    v[300]["rank"] = 7
elif kind == "rank-type":
    v[300]["rank"] = "300"
elif kind == "field":
    v[5]["score"] = 1.0
elif kind == "missing":
    del v[400]["token_str"]
elif kind == "base64":
    v[260]["token_bytes"] = "not base64!"
elif kind == "byte":
    v[65]["token_bytes"] = base64.b64encode(b"B").decode()
elif kind == "repeat":
    v[301]["token_bytes"] = v[300]["token_bytes"]
elif kind == "entry":
    v[10] = [10, "Cg=="]
elif kind == "object":
    v = {"tokens": v}
else:
    sys.exit("unknown kind " + kind)
json.dump(v, open(out, "w"))
