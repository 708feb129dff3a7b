package admin

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

// Users at run time (issue 15): kept in the metadata state machine, so
// durable with a data directory. Reading them needs the administrator tag
// as writing does (who may log in is an operator's business).

func (a *API) userRoutes() {
	m := a.mux
	m.HandleFunc("GET /api/users", func(w http.ResponseWriter, r *http.Request) {
		if !a.adminOnly(w, r) {
			return
		}
		us := a.b.Users()
		out := make([]api.User, len(us))
		for i, u := range us {
			out[i] = api.User{Name: u.Name, Tags: nonNil(u.Tags)}
		}
		writeJSON(w, 200, out)
	})
	m.HandleFunc("GET /api/users/{name}", func(w http.ResponseWriter, r *http.Request) {
		if !a.adminOnly(w, r) {
			return
		}
		u, ok := a.b.User(r.PathValue("name"))
		if !ok {
			writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no user " + strconv.Quote(r.PathValue("name"))})
			return
		}
		writeJSON(w, 200, api.User{Name: u.Name, Tags: nonNil(u.Tags)})
	})
	m.HandleFunc("PUT /api/users/{name}", a.putUser)
	m.HandleFunc("DELETE /api/users/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := a.b.DeleteUser(r.Context(), r.PathValue("name")); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// adminOnly answers 403 unless the request's user is an administrator
// (writes are checked for every endpoint in ServeAuthenticated).
func (a *API) adminOnly(w http.ResponseWriter, r *http.Request) bool {
	user, _ := r.Context().Value(userKey{}).(string)
	if err := a.conns.AuthorizeOperator(user); err != nil {
		writeErr(w, err)
		return false
	}
	return true
}

type userKey struct{}

func (a *API) putUser(w http.ResponseWriter, r *http.Request) {
	var body api.UserSettings
	if err := decode(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	name := r.PathValue("name")
	u := broker.MetaUser{Name: name, Tags: body.Tags}
	switch {
	case body.Password != nil && body.PasswordHash != "":
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "give password or password_hash, not both"})
		return
	case body.Password != nil:
		if *body.Password == "" || len(*body.Password) > 72 {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "a password is 1 to 72 bytes (bcrypt's limit)"})
			return
		}
		cost := a.PasswordCost
		if cost == 0 {
			cost = bcrypt.DefaultCost
		}
		h, err := bcrypt.GenerateFromPassword([]byte(*body.Password), cost) // a random salt per user
		if err != nil {
			writeErr(w, err)
			return
		}
		u.PasswordHash = string(h)
	case body.PasswordHash != "":
		if _, err := bcrypt.Cost([]byte(body.PasswordHash)); err != nil {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "password_hash is not a bcrypt hash (make one with warrend hash-password): " + err.Error()})
			return
		}
		u.PasswordHash = body.PasswordHash
	default:
		// No password: an existing user keeps its own (set-tags); a new
		// one needs one.
		old, ok := a.b.User(name)
		if !ok {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "user " + strconv.Quote(name) + " needs a password (or a bcrypt password_hash)"})
			return
		}
		u.PasswordHash = old.PasswordHash
		if body.Tags == nil {
			u.Tags = old.Tags
		}
	}
	if body.Tags == nil && (body.Password != nil || body.PasswordHash != "") {
		if old, ok := a.b.User(name); ok {
			u.Tags = old.Tags // a new password keeps the tags unless given
		}
	}
	if err := a.b.PutUser(r.Context(), u); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) permissionRoutes() {
	m := a.mux
	m.HandleFunc("GET /api/permissions", func(w http.ResponseWriter, r *http.Request) {
		if !a.adminOnly(w, r) {
			return
		}
		ps := a.b.Permissions()
		out := make([]api.Permission, len(ps))
		for i, p := range ps {
			out[i] = api.Permission{Vhost: p.Vhost, User: p.User, Configure: p.Configure, Write: p.Write, Read: p.Read}
		}
		writeJSON(w, 200, out)
	})
	m.HandleFunc("GET /api/permissions/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		if !a.adminOnly(w, r) {
			return
		}
		vhost, user, ok := vhostAndName(w, r, "/api/permissions/")
		if !ok {
			return
		}
		for _, p := range a.b.Permissions() {
			if p.Vhost == vhost && p.User == user {
				writeJSON(w, 200, api.Permission{Vhost: p.Vhost, User: p.User, Configure: p.Configure, Write: p.Write, Read: p.Read})
				return
			}
		}
		writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no permissions for user " + strconv.Quote(user) + " in vhost " + strconv.Quote(vhost)})
	})
	m.HandleFunc("PUT /api/permissions/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		vhost, user, ok := vhostAndName(w, r, "/api/permissions/")
		if !ok {
			return
		}
		var body api.Permission
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
		p := broker.MetaPermission{Vhost: vhost, User: user, Configure: body.Configure, Write: body.Write, Read: body.Read}
		if err := a.b.SetPermission(r.Context(), p); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("DELETE /api/permissions/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		vhost, user, ok := vhostAndName(w, r, "/api/permissions/")
		if !ok {
			return
		}
		if err := a.b.ClearPermission(r.Context(), vhost, user); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// vhostAndName splits the escaped path after prefix into a vhost and a
// name, each path-unescaped: the vhost "/" is written %2F (as RabbitMQ's
// API has it), which the router would otherwise take for a separator.
func vhostAndName(w http.ResponseWriter, r *http.Request, prefix string) (string, string, bool) {
	rest, _ := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	v, n, found := strings.Cut(rest, "/")
	vhost, err1 := url.PathUnescape(v)
	name, err2 := url.PathUnescape(n)
	if !found || vhost == "" || name == "" || strings.Contains(n, "/") || err1 != nil || err2 != nil {
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "want " + prefix + "{vhost}/{user}, the vhost / written %2F"})
		return "", "", false
	}
	return vhost, name, true
}
