"""The API's routes, one module per concern: ``health`` (/healthz, /readyz), ``clusters``
(clusters, engines), ``signals``, ``plans`` (plan, plans, forecast, accuracy), ``report``,
``advise``, ``costmodel``, ``targets``, ``metrics``. Each holds an APIRouter (api/app.py)."""
