"""The gateway (issue 15): one forward-proxy address whose every tunnel is a lease.

`server.Gateway` accepts clients; `options` authenticates them and reads the
username's options; `request` parses what they ask for; `fleet` finds
candidates and dials proxies; `tunnel` and `upstream` open the tunnel through
the chosen proxy; `relay` moves the bytes; `sessions` keeps sticky sessions;
`answers` and `wire` write every refusal. docs/gateway.md is the user's page.
"""
