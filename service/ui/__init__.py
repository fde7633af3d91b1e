"""The triage web page: server-rendered Jinja2 pages with a little vanilla JS, no build step, no CDN.

``/`` lists runs with their current verdict (newest first, filter by project/status/verdict,
paginated); ``/runs/{id}`` shows the ranked fault classes with score, strength, family and
evidence, and Plotly plots of the key metrics overlaid with the matched fingerprint's expected
shape and the detected change points, refreshing while the run is live; ``/faults`` is the fault
catalogue (SPEC section 3).  plotly.min.js is served from the installed ``plotly`` package.
The pages need a login (``auth.py``): a project's API token sees that project, ``MOEPROXY_UI_TOKEN``
every project, one-time links open one session; ``--public-ui`` opts out. Page reads never evaluate.

Reads the service's tables through plain query functions (``queries.py``); imports
``moeproxy.reproduction.catalogue`` (torch-free data) for the catalogue.
"""
