package auth

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"carehub/kernel/access"
)

func FuzzParseAuthorization(f *testing.F) {
	for _, s := range []string{
		"", "Bearer", "Bearer ", "bearer chk_test_abc", "BEARER  chk_live_x ", "Basic dXNlcjpwYXNz",
		"Bearer a b", "chk_live_0123456789abcdefghijABCDEFGHIJ01", "Bearer \x00", "Bearer é", "\tBearer\tx",
		"Bearer eyJhbGciOiJFZERTQSJ9.e30.sig", strings.Repeat("x", 5000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		cred, err := ParseAuthorization(v)
		if err != nil {
			if cred != "" {
				t.Fatalf("error %v with credential %q", err, cred)
			}
			return
		}
		if cred == "" || len(cred) > 4096 {
			t.Fatalf("credential %q of length %d accepted", cred, len(cred))
		}
		for i := 0; i < len(cred); i++ {
			if cred[i] < 0x21 || cred[i] > 0x7e {
				t.Fatalf("credential %q has byte %#x", cred, cred[i])
			}
		}
		// The credential round-trips through the header form clients send.
		again, err := ParseAuthorization("Bearer " + cred)
		if err != nil || again != cred {
			t.Fatalf("ParseAuthorization(Bearer %q) = %q, %v", cred, again, err)
		}
	})
}

// FuzzVerifyToken feeds arbitrary strings to Verify over a fixed key. Whatever it accepts must
// carry a genuine signature of that key over its first two segments, complete claims and
// carehub's audience.
func FuzzVerifyToken(f *testing.F) {
	k := fixedKey("fuzz")
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tk := staticTokens(func() time.Time { return at }, k)
	good := signWith(f, jwt.SigningMethodEdDSA, k.private, validClaims(at), map[string]any{"kid": k.kid})
	parts := strings.Split(good, ".")
	f.Add(good)
	f.Add(parts[0] + "." + parts[1] + ".")
	f.Add(signWith(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, validClaims(at), map[string]any{"kid": k.kid}))
	f.Add(signWith(f, jwt.SigningMethodHS256, []byte(k.public), validClaims(at), map[string]any{"kid": k.kid}))
	f.Add(signWith(f, jwt.SigningMethodEdDSA, k.private, validClaims(at.Add(-2*time.Hour)), map[string]any{"kid": k.kid}))
	noAud := validClaims(at)
	delete(noAud, "aud")
	f.Add(signWith(f, jwt.SigningMethodEdDSA, k.private, noAud, map[string]any{"kid": k.kid}))
	f.Add("a.b.c")
	f.Add("..")
	f.Add("eyJhbGciOiJFZERTQSJ9..")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := tk.Verify(context.Background(), token)
		if err != nil {
			return
		}
		segs := strings.Split(token, ".")
		if len(segs) != 3 {
			t.Fatalf("accepted %q with %d segments", token, len(segs))
		}
		sig, derr := base64.RawURLEncoding.DecodeString(segs[2])
		if derr != nil || !ed25519.Verify(k.public, []byte(segs[0]+"."+segs[1]), sig) {
			t.Fatalf("accepted %q without a valid signature", token)
		}
		if !strings.HasPrefix(c.KeyID, "key_") || (c.Mode != access.Live && c.Mode != access.Test) || c.ID == "" ||
			c.ExpiresAt.Before(at) || c.IssuedAt.IsZero() {
			t.Fatalf("accepted incomplete claims %+v", c)
		}
		for _, s := range c.Scopes {
			if !access.ValidScope(s) {
				t.Fatalf("accepted unknown scope %q", s)
			}
		}
		var payload struct {
			Aud jwt.ClaimStrings `json:"aud"`
		}
		raw, _ := base64.RawURLEncoding.DecodeString(segs[1])
		if json.Unmarshal(raw, &payload) != nil || !slices.Contains(payload.Aud, Audience) {
			t.Fatalf("accepted %q without aud %q", token, Audience)
		}
	})
}

func FuzzGraphQLOperation(f *testing.F) {
	for _, q := range []string{
		"{ patient(id: \"pat_1\") { id name } }",
		"query Q($id: ID!) { p: patient(id: $id) { ...F } organizations { id } } fragment F on FHIRPatient { id }",
		"mutation { runAgent(agentId: \"a\", patientId: \"p\", input: {x: [1, 2, {y: \"}\"}]}) { id } }",
		"subscription S @dir(a: 1) { eventStream(projectId: \"p\") { id } }",
		"{ ... on Query { patients { id } } ...Root } fragment Root on Query { organizations { id } }",
		"query { a } query { b }", "{", "}", "\"\"\"", "# only a comment", "{ a(x: \"\\\"\") }",
	} {
		f.Add(q, "")
	}
	f.Fuzz(func(t *testing.T, query, name string) {
		op := GraphQLOperation(query, name)
		if !strings.HasPrefix(op, "graphql ") || len(op) > maxOperationLen {
			t.Fatalf("GraphQLOperation(%q, %q) = %q", query, name, op)
		}
	})
}

// FuzzGraphQLOperationFromBody checks that the audit's reading of a GraphQL body names the
// operation json.Unmarshal into {query, operationName} would: the same members (any case, the
// last of a repeated one), and "graphql unparsed" for what it refuses.
func FuzzGraphQLOperationFromBody(f *testing.F) {
	for _, s := range []string{
		`{"query":"{ a }"}`, `{"query":"mutation M { b } query Q { c }","operationName":"Q"}`,
		`{"QUERY":"{ a }","query":"{ b }"}`, `{"query":"{ a }","query":null}`, `{"query":5}`,
		`{"query":"{ \u0061 }","variables":{"x":[1,{"y":"z"}]}}`, `"{ a }"`, `null`, `{`, ` {"Query" : "{ é }"} `,
		`{"operationname":"Q","query":"query Q { c } query R { d }"}`, `{"query":"\ud800"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		want := unparsedOperation
		var req struct {
			Query         string `json:"query"`
			OperationName string `json:"operationName"`
		}
		if json.Unmarshal([]byte(body), &req) == nil {
			want = GraphQLOperation(req.Query, req.OperationName)
		}
		if got := graphQLOperationFromBody("application/json", []byte(body)); got != want && !strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "[") {
			t.Fatalf("graphQLOperationFromBody(%q) = %q, want %q", body, got, want)
		}
	})
}
