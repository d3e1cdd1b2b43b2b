-- Rubin's rules over the copies of a multi-copy release, in SQL: free post-processing.
-- The same rules as dpsql.analysis.rubin.combine (fully synthetic data, Raghunathan, Reiter
-- & Rubin 2003, with Barnard & Rubin's 1999 small-sample degrees of freedom).
--
-- udfs.rubin(q, u[, confidence := 0.95][, complete_dof := NULL][, rows_ratio := 1.0]) is an
-- aggregate over one row per copy: q the copy's estimate, u its variance estimate. It
-- returns a STRUCT: estimate, std_error, ci_low, ci_high, dof, between, within, adjusted,
-- copies, unreliable, reason. For example, the mean age with its interval:
--   WITH per_copy AS (SELECT avg(age) AS q, var_samp(age) / count(*) AS u
--                     FROM released.adult_napsu GROUP BY _copy)
--   SELECT unnest(udfs.rubin(q, u)) FROM per_copy   -- one column per field
--
-- The t quantile is Hill's (1970, ACM Algorithm 396) approximation, within 3e-5 (relative) of the
-- exact one from 2.5 degrees of freedom up. Below 2.5 (a result flagged unreliable) the
-- degrees of freedom are rounded down to 2 or 1, where the quantile is exact: a wider
-- interval than Python's. Below 1 there is no interval (NULL bounds).
-- Helpers come before the macros that call them (DuckDB binds a macro when it is made).

CREATE OR REPLACE MACRO udfs._as241_central(r) AS
    (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r
          + 6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r
        + 1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r
      + 1.3314166789178437745e+2) * r + 3.3871328727963666080e+0)
    / (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r
            + 3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r
          + 5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r
        + 4.2313330701600911252e+1) * r + 1.0);

CREATE OR REPLACE MACRO udfs._as241_tail(s) AS
    CASE WHEN s <= 5 THEN
        (((((((7.74545014278341407640e-4 * (s - 1.6) + 2.27238449892691845833e-2) * (s - 1.6)
              + 2.41780725177450611770e-1) * (s - 1.6) + 1.27045825245236838258e+0) * (s - 1.6)
            + 3.64784832476320460504e+0) * (s - 1.6) + 5.76949722146069140550e+0) * (s - 1.6)
          + 4.63033784615654529590e+0) * (s - 1.6) + 1.42343711074968357734e+0)
        / (((((((1.05075007164441684324e-9 * (s - 1.6) + 5.47593808499534494600e-4) * (s - 1.6)
                + 1.51986665636164571966e-2) * (s - 1.6) + 1.48103976427480074590e-1) * (s - 1.6)
              + 6.89767334985100004550e-1) * (s - 1.6) + 1.67638483018380384940e+0) * (s - 1.6)
            + 2.05319162663775882187e+0) * (s - 1.6) + 1.0)
    ELSE
        (((((((2.01033439929228813265e-7 * (s - 5) + 2.71155556874348757815e-5) * (s - 5)
              + 1.24266094738807843860e-3) * (s - 5) + 2.65321895265761230930e-2) * (s - 5)
            + 2.96560571828504891230e-1) * (s - 5) + 1.78482653991729133580e+0) * (s - 5)
          + 5.46378491116411436990e+0) * (s - 5) + 6.65790464350110377720e+0)
        / (((((((2.04426310338993978564e-15 * (s - 5) + 1.42151175831644588870e-7) * (s - 5)
                + 1.84631831751005468180e-5) * (s - 5) + 7.86869131145613259100e-4) * (s - 5)
              + 1.48753612908506148525e-2) * (s - 5) + 1.36929880922735805310e-1) * (s - 5)
            + 5.99832206555887937690e-1) * (s - 5) + 1.0)
    END;

-- norm_quantile(p): the standard normal quantile (Wichura 1988, AS241).
CREATE OR REPLACE MACRO udfs.norm_quantile(p) AS
    CASE WHEN abs(p - 0.5) <= 0.425 THEN
        (p - 0.5) * udfs._as241_central(0.180625 - (p - 0.5) * (p - 0.5))
    ELSE
        sign(p - 0.5) * udfs._as241_tail(sqrt(-ln(least(p, 1 - p))))
    END;

CREATE OR REPLACE MACRO udfs._hill_normal_y(b, c, x) AS
    (((((0.4 * x * x + 6.3) * x * x + 36) * x * x + 94.5) / c - x * x - 3) / b + 1) * x;

-- The asymptotic expansion about the normal quantile x (Hill's P > P0(df) branch).
CREATE OR REPLACE MACRO udfs._hill_normal(df, a, b, c, d, x) AS
    sqrt(df * (exp(a * udfs._hill_normal_y(
        b, (((0.05 * d * x - 5) * x - 7) * x - 2) * x + b + c
            + CASE WHEN df < 5 THEN 0.3 * (df - 4.5) * (x + 0.6) ELSE 0 END, x) ^ 2) - 1));

CREATE OR REPLACE MACRO udfs._hill_y(tail, df, a, b, c, d) AS
    CASE WHEN (d * tail) ^ (2 / df) > 0.05 + a THEN
        udfs._hill_normal(df, a, b, c, d, udfs.norm_quantile(0.5 * tail))
    ELSE
        sqrt(df * (((1 / (((df + 6) / (df * (d * tail) ^ (2 / df)) - 0.089 * d - 0.822)
                         * (df + 2) * 3) + 0.5 / (df + 4)) * (d * tail) ^ (2 / df) - 1)
                   * (df + 1) / (df + 2) + 1 / (d * tail) ^ (2 / df)))
    END;

CREATE OR REPLACE MACRO udfs._hill_d(tail, df, a, b, c) AS
    udfs._hill_y(tail, df, a, b, c, ((94.5 / (b + c) - 3) / b + 1) * sqrt(a * pi() / 2) * df);

-- Hill's algorithm for two-sided tail P and df >= 2.5 (a = 1 / (df - 1/2)).
CREATE OR REPLACE MACRO udfs._hill(tail, df, a) AS
    udfs._hill_d(tail, df, a, 48 / (a * a), ((20700 * a / (48 / (a * a)) - 98) * a - 16) * a + 96.36);

-- t_quantile(p, df), p >= 0.5: Student's t quantile (see the accuracy note above).
CREATE OR REPLACE MACRO udfs.t_quantile(p, df) AS
    CASE WHEN isinf(df) THEN udfs.norm_quantile(p)
         WHEN df >= 2.5 THEN udfs._hill(2 * (1 - p), df, 1 / (df - 0.5))
         WHEN df >= 2 THEN sqrt(2 / ((2 - 2 * p) * (2 * p)) - 2)
         WHEN df >= 1 THEN tan(pi() * (p - 0.5))
    END;

-- Barnard & Rubin's nu_obs for complete original data; infinite when nu_com is unknown.
CREATE OR REPLACE MACRO udfs._observed_dof(nu_com) AS
    CASE WHEN nu_com IS NULL THEN 'inf'::DOUBLE
         WHEN nu_com <= 0 THEN error('udfs.rubin: complete_dof must be positive')
         ELSE (nu_com + 1) / (nu_com + 3) * nu_com END;

CREATE OR REPLACE MACRO udfs._rubin_result(m, q_bar, b, u_bar, se, half, dof, adjusted, reason) AS
    {'estimate': q_bar, 'std_error': se, 'ci_low': q_bar - half, 'ci_high': q_bar + half,
     'dof': dof, 'between': b, 'within': u_bar, 'adjusted': adjusted, 'copies': m,
     'unreliable': reason IS NOT NULL, 'reason': coalesce(reason, '')};

CREATE OR REPLACE MACRO udfs._rubin_interval(m, q_bar, b, u_bar, b_total, p, total, dof) AS
    udfs._rubin_result(m, q_bar, b, u_bar, sqrt(total), udfs.t_quantile(p, dof) * sqrt(total),
                       dof, b_total <= u_bar,
                       CASE WHEN b_total <= u_bar THEN
                                'T <= 0: the copies vary less than their own variance '
                                || 'estimates predict; Reiter''s T* = (n_syn/n) u_bar was used'
                            WHEN dof < 3 THEN
                                'df < 3: the interval''s width is itself very uncertain; '
                                || 'more copies (dpsql release-more, free) make it firmer'
                            WHEN b_total > 10 * u_bar THEN
                                'the between-copy variance dominates: (1 + 1/m) b > 10 u_bar; '
                                || 'the interval rests on the synthesizer''s model of the DP noise'
                       END);

CREATE OR REPLACE MACRO udfs._rubin(m, q_bar, b, u_bar, b_total, p, nu_obs, rows_ratio) AS
    udfs._rubin_interval(m, q_bar, b, u_bar, b_total, p,
        CASE WHEN b_total <= u_bar THEN rows_ratio * u_bar ELSE b_total - u_bar END,
        CASE WHEN b_total <= u_bar THEN nu_obs
             ELSE 1 / (1 / ((m - 1) * (1 - u_bar / b_total) ^ 2) + 1 / nu_obs) END);

-- rubin(q, u, ...): the aggregate. One row per copy; at least 2 copies.
CREATE OR REPLACE MACRO udfs.rubin(q, u, confidence := 0.95, complete_dof := NULL,
                                   rows_ratio := 1.0) AS
    CASE WHEN count(q) < 2 OR count(u) <> count(q) THEN
             error('udfs.rubin needs an estimate and a variance from at least 2 copies')
         WHEN min(u) < 0 OR NOT isfinite(sum(q)) OR NOT isfinite(sum(u)) THEN
             error('udfs.rubin: estimates must be finite and variances non-negative')
         WHEN NOT (confidence > 0 AND confidence < 1) THEN
             error('udfs.rubin: confidence must be between 0 and 1')
         ELSE udfs._rubin(count(q), avg(q), var_samp(q), avg(u), (1 + 1 / count(q)) * var_samp(q),
                          0.5 + confidence / 2, udfs._observed_dof(complete_dof), rows_ratio)
    END;
