"""
Imported first by the scripts that import torch (train.py, sweep.py, sample.py), for its one effect: a Ctrl-C in the
seconds torch takes to import, before the script's own handlers are in place, stops it with one line and exit code
130, `train.py: stopped by Ctrl-C while starting; nothing was written`, not a KeyboardInterrupt traceback and -2.
Nothing is written before main() runs, so there is nothing to clean up. Only where the script itself was started
(its file is __main__'s): a test or a notebook that imports train keeps Python's own Ctrl-C. Once the script has
defined its main(), a Ctrl-C is Python's KeyboardInterrupt again, which the script handles (or replaces with its
own handler). Its second effect: a closed pipe (`python sweep.py --dry_run | head`) ends the script quietly, as it
ends `cat`, instead of a BrokenPipeError traceback. Imports only the standard library.
"""

import os
import signal
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root, where the scripts are


def stop(signum, frame):
    script = sys.modules["__main__"]
    if hasattr(script, "main"):  # defined after the imports: from here on the script's own Ctrl-C handling
        raise KeyboardInterrupt
    print(f"{os.path.basename(script.__file__)}: stopped by Ctrl-C while starting; nothing was written",
          file=sys.stderr)
    raise SystemExit(130)


main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
if os.path.dirname(os.path.abspath(main_file)) == HERE:
    signal.signal(signal.SIGINT, stop)
    if hasattr(signal, "SIGPIPE"):  # POSIX: the reader went away, so nothing printed from here on can be read
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
