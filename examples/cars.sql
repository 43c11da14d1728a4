-- examples/connected_cars.py in SQL: each car's average speed (m/s) per minute, over the
-- readings faster than 5 m/s. Run it with
--   python -m pescheduler deploy examples/cars.sql
-- source cars: generator {"events": 200000, "keys": 10000, "seed": 7}
-- sink: jsonl {"path": "cars_sql.jsonl"}
SELECT car, AVG(speed / 3.6) AS avg_speed, window_start, window_end
FROM TABLE(TUMBLE(TABLE cars, DESCRIPTOR(ts), INTERVAL '60' SECOND))
WHERE speed / 3.6 > 5
GROUP BY car, window_start, window_end
