from __future__ import annotations

import pytest

from dpsql.server.sqltext import (
    SQLTextError,
    bind_parameters,
    max_parameter,
    split_statements,
    strip_comments,
)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("SELECT 1; SELECT 2;", ["SELECT 1", " SELECT 2"], id="two"),
    pytest.param("SELECT ';' AS x", ["SELECT ';' AS x"], id="semicolon_in_string"),
    pytest.param('SELECT 1 AS "a;b"', ['SELECT 1 AS "a;b"'], id="semicolon_in_identifier"),
    pytest.param("SELECT 1 -- ; not a split\n", ["SELECT 1 -- ; not a split\n"], id="comment"),
    pytest.param("SELECT /* ; /* nested ; */ */ 1", ["SELECT /* ; /* nested ; */ */ 1"],
                 id="nested_block_comment"),
    pytest.param("SELECT $tag$ ; $$ ; $tag$", ["SELECT $tag$ ; $$ ; $tag$"], id="dollar_quote"),
    pytest.param("SELECT E'it\\'s ;'", ["SELECT E'it\\'s ;'"], id="escape_string"),
    pytest.param(";; -- only a comment\n;", [], id="empty"),
])
def test_split_statements(text, expected):
    assert split_statements(text) == expected


@pytest.mark.parametrize("text", ["SELECT 'open", 'SELECT "open', "SELECT /* open",
                                  "SELECT $x$ open"])
def test_unterminated_text_is_an_error(text):
    with pytest.raises(SQLTextError):
        split_statements(text)


def test_parameters_are_found_outside_strings_and_comments_only():
    text = "SELECT $1, '$2', \"$3\", $$ $4 $$ -- $5\n, $12 /* $6 */, a$1"
    assert max_parameter(text) == 12
    bound = bind_parameters(text, lambda n: f"<{n}>")
    assert bound == "SELECT <1>, '$2', \"$3\", $$ $4 $$ -- $5\n, <12> /* $6 */, a$1"


def test_strip_comments_keeps_strings():
    assert strip_comments("SELECT '--x' -- y\n/* z */ 1") == "SELECT '--x'    1"
