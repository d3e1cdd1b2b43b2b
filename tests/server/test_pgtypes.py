from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from dpsql.server.pgtypes import (
    BadParameter,
    _numeric_binary,
    _numeric_from_binary,
    column_encoder,
    from_arrow,
    from_duckdb,
    parameter_literal,
    text_value,
)


@pytest.mark.parametrize(("dtype", "oid"), [
    (pa.bool_(), 16), (pa.int16(), 21), (pa.int32(), 23), (pa.int64(), 20),
    (pa.float32(), 700), (pa.float64(), 701), (pa.decimal128(10, 2), 1700),
    (pa.string(), 25), (pa.large_string(), 25), (pa.binary(), 17), (pa.date32(), 1082),
    (pa.timestamp("us"), 1114), (pa.timestamp("us", tz="UTC"), 1184),
    (pa.list_(pa.int64()), 1016), (pa.list_(pa.string()), 1009), (pa.null(), 25),
    (pa.dictionary(pa.int32(), pa.string()), 25), (pa.uint32(), 26),
])
def test_arrow_types_map_to_postgres_oids(dtype, oid):
    assert from_arrow(dtype)[0].oid == oid


def test_decimal_typmod_encodes_precision_and_scale():
    assert from_arrow(pa.decimal128(10, 3))[1] == (10 << 16 | 3) + 4
    assert from_duckdb("DECIMAL(10,3)") == (from_arrow(pa.decimal128(10, 3))[0], (10 << 16 | 3) + 4)
    assert from_duckdb("BIGINT[]")[0].oid == 1016


@pytest.mark.parametrize(("value", "text"), [
    (True, "t"), (0.1, "0.1"), (1.0, "1"), (1e300, "1e+300"), (float("nan"), "NaN"),
    (float("-inf"), "-Infinity"), (Decimal("1E+3"), "1000"), (b"\x00\xff", "\\x00ff"),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 600), "2024-01-02 03:04:05.000600"),
    (dt.datetime(2024, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
     "2024-01-02 00:00:00+05:30"),
    (dt.timedelta(days=2, seconds=3661), "2 days 01:01:01"),
    ([1, None, 3], "{1,NULL,3}"), (["a b", 'q"', ""], '{"a b","q\\"",""}'),
])
def test_text_output_matches_postgres(value, text):
    assert text_value(value) == text


def test_timestamptz_follows_the_session_time_zone():
    value = dt.datetime(2024, 7, 1, 12, tzinfo=dt.timezone.utc)
    zone = dt.timezone(dt.timedelta(hours=2))
    assert text_value(value, zone) == "2024-07-01 14:00:00+02"


@pytest.mark.parametrize("value", ["0", "1", "-1", "12.340", "0.0001", "123456789.987654321",
                                   "-99990000", "1E+5", "NaN"])
def test_numeric_binary_round_trips(value):
    number = Decimal(value)
    back = _numeric_from_binary(_numeric_binary(number))
    assert (back.is_nan() and number.is_nan()) or back == number


def test_numeric_binary_layout():
    # 12.34 -> digits [12, 3400], weight 0, positive, dscale 2 (PostgreSQL's numeric_send)
    assert _numeric_binary(Decimal("12.34")) == struct.pack("!hhHhHH", 2, 0, 0, 2, 12, 3400)


def test_binary_arrays_use_the_element_type():
    encode = column_encoder(pa.list_(pa.int32()), binary=True)
    data = encode([7, None])
    assert struct.unpack("!iiIii", data[:20]) == (1, 1, 23, 2, 1)
    assert data[20:] == struct.pack("!ii", 4, 7) + struct.pack("!i", -1)


@pytest.mark.parametrize(("data", "oid", "binary", "literal"), [
    (b"it's", 0, False, "'it''s'"), (b"-5", 20, False, "(-5)"), (b"2.5", 701, False, "2.5"),
    (b"-0.5", 1700, False, "(-0.5)"), (b"t", 16, False, "TRUE"), (None, 23, False, "NULL"),
    (struct.pack("!q", -3), 20, True, "(-3)"), (struct.pack("!d", 0.25), 701, True, "0.25"),
    (b"NaN", 701, False, "CAST('NaN' AS DOUBLE)"), (b"x\\y", 25, False, "'x\\y'"),
])
def test_parameters_become_literals(data, oid, binary, literal):
    assert parameter_literal(data, oid, binary) == literal


@pytest.mark.parametrize(("data", "oid"), [(b"12; DROP TABLE x", 23), (b"1 OR 1=1", 701),
                                           (b"maybe", 16), (b"a\x00b", 25), (b"\x01", 17)])
def test_bad_parameters_are_refused(data, oid):
    with pytest.raises(BadParameter):
        parameter_literal(data, oid, binary=False)
