
import json, os, select, socket, sys, threading, time
sys.path.insert(0, {repo!r})
import chainer_autoprof.agent, chainer_autoprof.cli, chainer_autoprof.report.dump
import chainer_autoprof.report.stall, chainer_autoprof.lifecycle.finish
import pwd, tempfile, struct, stat, contextlib, linecache, traceback, faulthandler
os.setgroups([])
os.setgid({gid})
os.setuid({uid})
os.environ.pop("XDG_RUNTIME_DIR", None)
{code}
