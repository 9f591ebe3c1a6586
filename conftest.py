"""The tests' shared fixtures (pytest reads this file for test_norms.py and every file in tests/)."""
import os

ROOT = os.path.dirname(os.path.abspath(__file__))
# GPT-2's BPE ranks, offline: tests never reach the network (the README's test command sets nothing).
os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.join(os.path.dirname(ROOT), "shared", "tiktoken"))
