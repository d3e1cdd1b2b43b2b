"""COPY output formats and cursor positions, checked against PostgreSQL's documented rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dpsql.server import copyout, cursors

TEN = pa.table({"n": list(range(1, 11))})  # row k holds k


@pytest.mark.parametrize(("moves", "rows", "position"), [
    pytest.param(["NEXT", "NEXT"], [[1], [2]], 2, id="next"),
    pytest.param(["FORWARD 3", "FORWARD 3"], [[1, 2, 3], [4, 5, 6]], 6, id="forward"),
    pytest.param(["ALL", "NEXT"], [list(range(1, 11)), []], 11, id="all_then_past_end"),
    pytest.param(["8", "FORWARD 5"], [list(range(1, 9)), [9, 10]], 11, id="past_the_end"),
    pytest.param(["FORWARD 10"], [list(range(1, 11))], 10, id="exactly_to_the_end"),
    pytest.param(["ABSOLUTE 4", "PRIOR"], [[4], [3]], 3, id="absolute_prior"),
    pytest.param(["ABSOLUTE -1"], [[10]], 10, id="absolute_from_end"),
    pytest.param(["LAST", "BACKWARD 3"], [[10], [9, 8, 7]], 7, id="backward"),
    pytest.param(["3", "BACKWARD ALL"], [[1, 2, 3], [2, 1]], 0, id="backward_all"),
    pytest.param(["ABSOLUTE 12"], [[]], 11, id="absolute_beyond"),
    pytest.param(["ABSOLUTE 5", "RELATIVE 0", "RELATIVE -2"], [[5], [5], [3]], 3,
                 id="relative"),
    pytest.param(["FIRST", "FORWARD 0"], [[1], [1]], 1, id="forward_zero_refetches"),
    pytest.param(["ABSOLUTE 0", "NEXT"], [[], [1]], 1, id="before_first"),
])
def test_cursor_positions_follow_postgres(moves, rows, position):
    cursor = cursors.Cursor(TEN, hold=False)
    got = [[TEN.column("n")[i].as_py() for i in cursor.step(move)] for move in moves]
    assert got == rows
    assert cursor.position == position


@pytest.mark.parametrize(("sql", "name", "direction", "move"), [
    ("FETCH FORWARD 5 FROM \"My Cursor\"", "My Cursor", "FORWARD 5", False),
    ("fetch c", "c", "NEXT", False),
    ("MOVE absolute  -2 in C", "c", "ABSOLUTE -2", True),
    ("FETCH next", "next", "NEXT", False),
])
def test_fetch_statements_parse(sql, name, direction, move):
    assert cursors.parse_fetch(sql) == cursors.Fetch(name, direction, move)


def test_declare_statements_parse():
    psycopg = 'DECLARE "c1" NO SCROLL CURSOR WITH HOLD FOR SELECT a FROM t'
    assert cursors.parse_declare(psycopg) == cursors.Declare("c1", "SELECT a FROM t", True, False)
    assert cursors.parse_declare("declare x binary cursor for select 1").binary
    assert cursors.parse_declare("DECLARE x FOR SELECT 1") is None


TRICKY = pa.table({"word": ["plain", "a,b", 'say "hi"', "two\nlines", "tab\there", "back\\slash",
                            "", None, "\\N"], "n": [1, 2, 3, 4, 5, 6, 7, 8, 9]})


def _copy(options: str) -> list[str]:
    statement = copyout.parse(f"COPY (SELECT * FROM t) TO STDOUT {options}")
    assert statement is not None
    return [line.decode() for line in copyout.lines(TRICKY, statement.format, None)]


def test_csv_quotes_what_postgres_quotes():
    assert _copy("WITH CSV HEADER") == [
        "word,n\n", "plain,1\n", '"a,b",2\n', '"say ""hi""",3\n', '"two\nlines",4\n',
        "tab\there,5\n", "back\\slash,6\n", '"",7\n', ",8\n", "\\N,9\n"]


def test_text_format_escapes_what_postgres_escapes():
    assert _copy("") == [
        "plain\t1\n", "a,b\t2\n", 'say "hi"\t3\n', "two\\nlines\t4\n", "tab\\there\t5\n",
        "back\\\\slash\t6\n", "\t7\n", "\\N\t8\n", "\\\\N\t9\n"]


def test_options_in_both_syntaxes():
    assert _copy("(FORMAT csv, DELIMITER ';', NULL 'NA', QUOTE '''')")[1:3] == [
        "a,b;2\n", "say \"hi\";3\n"]
    assert _copy("(FORMAT csv, DELIMITER ';', NULL 'NA')")[7] == "NA;8\n"
    assert _copy("WITH DELIMITER AS ',' NULL AS ''")[1:3] == ["a\\,b,2\n", 'say "hi",3\n']
    assert _copy("(FORMAT csv, HEADER false)")[0] == "plain,1\n"


def test_copy_of_a_table_reads_it_with_a_query():
    statement = copyout.parse('COPY released."Syn" (age, "Sex") TO STDOUT CSV')
    assert statement is not None
    assert statement.query == 'SELECT age, "Sex" FROM released."Syn"'
    assert copyout.parse("COPY t (a; DROP x) TO STDOUT") is None
    assert copyout.parse("COPY t TO '/tmp/file'") is None
