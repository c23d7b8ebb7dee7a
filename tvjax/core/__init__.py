"""The estimation core, in JAX: processes with known TV (`instances`), access models (`oracles`),
the currency's arithmetic (`currency`), sizes (`schedules`), query accounting (`cost`), the chunked
reduction (`streaming`), where programs compile (`programs`), the estimators (`estimators`),
`estimate_tv` (`api`) and repeated estimates (`studies`). Nothing here reads a pool or a model file."""
