"""Every parser of command output, fed arbitrary text: nothing escapes but the parser's own ParseError
(shape-aware fuzzing of each parser lives beside its other tests)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.core.errors import ParseError
from nodecheck.probes.lstopo import parse_lstopo_xml
from nodecheck.probes.nics import parse_proc_route
from nodecheck.probes.topo import parse_topo_matrix


@pytest.mark.parametrize("parse", [parse_topo_matrix, parse_lstopo_xml, parse_nccl_log, parse_proc_route],
                         ids=lambda f: f.__name__)
@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_only_parse_errors_escape(parse, text):
    try:
        parse(text)
    except ParseError:
        pass
