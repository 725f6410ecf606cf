"""What every room of kvscope may import: the exception tree (errors), the records that flow
between rooms (records) and the metric catalogue, the one place a vendor metric name is
spelled (catalog). core imports nothing else of kvscope."""
