package admin

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// Virtual hosts (issue 15): PUT, GET and DELETE /api/vhosts/{name}, and
// the vhost in the paths of exchanges and queues. Every path with {name}
// has a twin with {vhost}/{name} (/ written %2F, as RabbitMQ's API has
// it); the path without a vhost is the default vhost's. Lists take
// ?vhost= (default "/"), bindings /api/bindings/{vhost}. Names in and out
// are the clients' (broker.QualifyName, broker.LocalName).

// handle registers pattern, and its twin with the vhost when it names a
// resource ({name}).
func (a *API) handle(pattern string, h http.HandlerFunc) {
	a.mux.HandleFunc(pattern, h)
	if strings.Contains(pattern, "/{name}") {
		a.mux.HandleFunc(strings.Replace(pattern, "/{name}", "/{vhost}/{name}", 1), h)
	}
}

// reqVhost is the vhost a request names: its path's {vhost}, else its
// ?vhost=, else "/".
func reqVhost(r *http.Request) string {
	if v := r.PathValue("vhost"); v == defaultVhostSegment {
		return broker.DefaultVhost
	} else if v != "" {
		return v
	}
	if v := r.URL.Query().Get("vhost"); v != "" {
		return v
	}
	return broker.DefaultVhost
}

// defaultVhostSegment stands for a path segment %2F (the vhost "/"),
// which http.ServeMux does not route as one segment: withVhostSegments
// writes it %1F, a control character no vhost name holds.
const defaultVhostSegment = "\x1f"

// withVhostSegments rewrites r's path segments %2F to %1F, for the
// routes with a {vhost} (the permissions' routes split the path
// themselves).
func withVhostSegments(r *http.Request) *http.Request {
	esc := r.URL.EscapedPath()
	if !strings.Contains(strings.ToUpper(esc), "/%2F") || strings.HasPrefix(esc, "/api/permissions/") {
		return r
	}
	segs := strings.Split(esc, "/")
	for i, s := range segs {
		if strings.EqualFold(s, "%2F") {
			segs[i] = "%1F"
		}
	}
	raw := strings.Join(segs, "/")
	p, err := url.PathUnescape(raw)
	if err != nil {
		return r
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = p, raw
	return r2
}

// qname is the internal name of the request's {name} in its vhost.
func qname(r *http.Request) string { return broker.QualifyName(reqVhost(r), r.PathValue("name")) }

// qualify is the internal name of a name the request gives ("" stays "":
// no alternate exchange, or the default exchange of a binding).
func qualify(r *http.Request, name string) string {
	if name == "" {
		return ""
	}
	return broker.QualifyName(reqVhost(r), name)
}

// localErr strips vhosts from the names quoted in err.
func localErr(err error) error {
	if we, ok := err.(*wire.Error); ok {
		return &wire.Error{Code: we.Code, Reason: broker.LocalText(we.Reason)}
	}
	return err
}

func (a *API) vhostRoutes() {
	m := a.mux
	m.HandleFunc("GET /api/vhosts", func(w http.ResponseWriter, r *http.Request) {
		vs := a.b.Vhosts()
		out := make([]api.Vhost, len(vs))
		for i, v := range vs {
			out[i] = a.vhostJSON(v)
		}
		writeJSON(w, 200, out)
	})
	m.HandleFunc("GET /api/vhosts/{vhost}", func(w http.ResponseWriter, r *http.Request) {
		v, ok := a.b.Vhost(reqVhost(r))
		if !ok {
			writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no virtual host " + strconv.Quote(reqVhost(r))})
			return
		}
		writeJSON(w, 200, a.vhostJSON(v))
	})
	m.HandleFunc("PUT /api/vhosts/{vhost}", func(w http.ResponseWriter, r *http.Request) {
		var body api.VhostSettings
		if r.ContentLength != 0 {
			if err := decode(r, &body); err != nil {
				writeErr(w, err)
				return
			}
		}
		v := broker.MetaVhost{Name: reqVhost(r), MaxQueues: body.MaxQueues, MaxConnections: body.MaxConnections}
		if err := a.b.PutVhost(r.Context(), v); err != nil {
			writeErr(w, err)
			return
		}
		v, _ = a.b.Vhost(v.Name)
		writeJSON(w, 200, a.vhostJSON(v))
	})
	m.HandleFunc("DELETE /api/vhosts/{vhost}", func(w http.ResponseWriter, r *http.Request) {
		if err := a.b.DeleteVhost(r.Context(), reqVhost(r)); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("GET /api/bindings/{vhost}", a.wholeList(a.listBindings))
	m.HandleFunc("PUT /api/bindings/{vhost}", func(w http.ResponseWriter, r *http.Request) { a.binding(w, r, false) })
	m.HandleFunc("DELETE /api/bindings/{vhost}", func(w http.ResponseWriter, r *http.Request) { a.binding(w, r, true) })
}

func (a *API) vhostJSON(v broker.MetaVhost) api.Vhost {
	out := api.Vhost{Name: v.Name, VhostSettings: api.VhostSettings{MaxQueues: v.MaxQueues, MaxConnections: v.MaxConnections},
		Queues: a.b.VhostQueues(v.Name)}
	// The connection layer counts them if it can (netio's does).
	if vc, ok := a.conns.(interface{ VhostConnections(string) int }); ok {
		out.Connections = vc.VhostConnections(v.Name)
	}
	return out
}

// listExchanges lists the exchanges of the request's vhost.
func (a *API) listExchanges(w http.ResponseWriter, r *http.Request) {
	vh := reqVhost(r)
	out := []api.Exchange{}
	for _, e := range a.b.Exchanges() {
		if broker.InVhost(e.Name, vh) {
			out = append(out, localExchange(e))
		}
	}
	writeJSON(w, 200, out)
}

func localExchange(e broker.ExchangeInfo) api.Exchange {
	e.Name = broker.LocalName(e.Name)
	if e.Alternate != "" {
		e.Alternate = broker.LocalName(e.Alternate)
	}
	return api.Exchange(e)
}

// listBindings lists the bindings of the request's vhost.
func (a *API) listBindings(w http.ResponseWriter, r *http.Request) {
	vh := reqVhost(r)
	out := []api.Binding{}
	for _, b := range a.b.Bindings() {
		if !broker.InVhost(b.Source, vh) {
			continue
		}
		bj := api.Binding{Exchange: broker.LocalName(b.Source), RoutingKey: b.RoutingKey, Arguments: tableToJSON(b.Args)}
		if b.ToExchange {
			bj.DestinationExchange = broker.LocalName(b.Destination)
		} else {
			bj.Queue = broker.LocalName(b.Destination)
		}
		out = append(out, bj)
	}
	writeJSON(w, 200, out)
}

// inVhost keeps the queues of vhost (internal names: the rates are kept
// by them; a.queue answers the client's).
func inVhost(stats []broker.QueueStats, vhost string) []broker.QueueStats {
	out := stats[:0]
	for _, s := range stats {
		if broker.InVhost(s.Name, vhost) {
			out = append(out, s)
		}
	}
	return out
}
