"""The ClassAd library, loaded the one safe way (see shared/reference/classad-policies.md).

`classad2` alone leaks memory on every evaluation until HTCondor's configuration has run, and
`import htcondor2` switches evaluation to old-ClassAd semantics and reads /etc/condor/condor_config
unless told otherwise. So the configuration is pinned to nothing and strict semantics before either
is imported. This is the only module of the inner layers that touches the environment, and only to
set these two variables for the C++ library before it loads; it reads no clock, file or network.
"""

from __future__ import annotations

import os

os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
os.environ.setdefault("_CONDOR_STRICT_CLASSAD_EVALUATION", "true")

import htcondor2  # noqa: F401 - first: runs HTCondor's config(), which stops the leak
from classad2 import ClassAd, ClassAdException, ExprTree, ParserType, Value, parseAds

__all__ = ["ClassAd", "ClassAdException", "ExprTree", "ParserType", "Value", "parseAds"]
