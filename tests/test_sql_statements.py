"""The SQL statement features: a statement's verb and whether a WHERE clause limits it."""

from __future__ import annotations

import json

import numpy as np
from wide_only import WideOnly

from gated.engine.sql_statements import MAX_STATEMENTS, sql_statements
from gated.engine.wide import _bucket, structured_features


def _query(sql: str) -> str:
    return f"db.query {json.dumps({'sql': sql})}"


def test_a_statements_verb_and_its_own_where_clause() -> None:
    assert sql_statements("DELETE FROM users WHERE id = 3") == [("DELETE", "where")]
    assert sql_statements("delete from users_7;") == [("DELETE", "all")]
    assert sql_statements("TRUNCATE TABLE a.b RESTART IDENTITY") == [("TRUNCATE", "all")]
    assert sql_statements("SELECT 1; drop table t") == [("SELECT", "all"), ("DROP", "all")]
    # a subquery's WHERE does not limit the statement; a CTE's verb is not the statement's
    assert sql_statements("DELETE FROM t USING (SELECT id FROM u WHERE a) b") == [
        ("DELETE", "all")]
    assert sql_statements("WITH old AS (SELECT id FROM t WHERE x) DELETE FROM t "
                          "WHERE id IN (SELECT id FROM old)") == [("DELETE", "where")]
    assert sql_statements("UPDATE t SET a = (1)) WHERE id = 2") == [("UPDATE", "where")]
    for text in ("", "hello world", "rm -rf /", "where are my files", "(((", "WITH"):
        assert sql_statements(text) == [], text


def test_sql_features_are_keyed_by_tool_and_argument_and_bounded() -> None:
    n = 1 << 16
    idx, val = structured_features(_query("delete from t_5;"), None, n, 0.0, 0.0,
                                   sql_scale=0.8)
    assert list(idx) == [_bucket(k, n) for k in ("q|db.query|sql|DELETE",
                                                 "q|db.query|sql|DELETE|all",
                                                 "q|db.query|sql|changes rows|all")]
    np.testing.assert_allclose(val, [0.8 / np.sqrt(3)] * 3)
    idx, _ = structured_features(_query("TRUNCATE a; SELECT b"), None, n, 0.0, 0.0,
                                 sql_scale=0.8)
    assert set(idx) == {_bucket(k, n) for k in (
        "q|db.query|sql|TRUNCATE", "q|db.query|sql|TRUNCATE|all",
        "q|db.query|sql|changes rows|all", "q|db.query|sql|SELECT", "q|db.query|sql|SELECT|all")}
    assert structured_features(_query("delete from t_5;"), None, n, 0.0, 0.0)[0].size == 0
    assert structured_features('fs.read {"path": "x.sql"}', None, n, 0.0, 0.0,
                               sql_scale=0.8)[0].size == 0
    hostile = _query(";".join(f"DELETE FROM t{i}" for i in range(5000)))
    idx, val = structured_features(hostile, None, n, 0.0, 0.0, sql_scale=0.8)
    assert len(idx) == 3 and np.linalg.norm(val) <= 0.8 + 1e-12  # distinct names only
    assert len(sql_statements(";".join(["SELECT 1"] * 5000))) == MAX_STATEMENTS


def test_the_statement_features_carry_a_missing_where_to_an_unseen_form() -> None:
    """A wide-only learner that saw blocked ``DROP TABLE`` and unlimited ``DELETE FROM
    schema.table`` among allowed limited deletes and selects: with the statement features,
    an unlimited delete written another way (lower case, no schema, a semicolon) scores
    well below a limited one written that way too; from words alone, the one thing that
    tells them apart -- a WHERE that is absent -- is no feature at all."""
    rng = np.random.default_rng(0)

    def gap(sql_scale: float) -> float:
        wide = WideOnly(wide_pair_rank=0, wide_sql_statements=sql_scale)
        for k in range(400):
            kind = rng.integers(4)
            sql = (f"DROP TABLE public.t{k}", f"DELETE FROM public.t{k}",
                   f"DELETE FROM public.t{k} WHERE id = {k}", f"SELECT a FROM t{k} WHERE b")[kind]
            wide.learn(_query(sql), None, 0.0 if kind < 2 else 1.0)
        z = [wide.logit(_query(q)) for q in ("delete from orders_9;",
                                             "delete from orders_9 where id = 4;")]
        return z[1] - z[0]  # how much lower the unlimited delete scores

    without, with_them = gap(0.0), gap(1.0)
    print(f"limited minus unlimited delete: without the features {without:+.3f}, "
          f"with them {with_them:+.3f}")
    assert with_them > 1.0 and with_them > without + 1.0
