package server

import (
	"context"
	"net/http"
	"slices"

	"github.com/gorilla/mux"

	"carehub/api/auth"
	"carehub/api/rest"
)

// wire builds the HTTP handler and starts the background workers of the configured roles.
// wctx lives until shutdown; ctx only bounds start-up.
func (s *Server) wire(ctx context.Context, wctx context.Context) (http.Handler, error) {
	r := mux.NewRouter()
	obs := observe(s.logger, newHTTPMetrics(s.registry))
	r.Use(obs)
	// mux runs middleware only on matched routes; these get it explicitly so every response
	// carries a Request-Id and the error envelope.
	r.NotFoundHandler = obs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest.WriteError(w, r, notFound)
	}))
	r.MethodNotAllowedHandler = obs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest.WriteError(w, r, methodNotAllowed)
	}))
	s.health(r)

	keys := auth.NewKeys(s.pool)
	authn := auth.NewAuthenticator(keys, &auth.Tokens{})
	_ = authn
	if s.has(RoleAPI) {
		// Routes of the API role are mounted here.
	}
	return r, nil
}

func (s *Server) has(role string) bool { return slices.Contains(s.cfg.Roles, role) }
