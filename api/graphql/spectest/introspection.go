package spectest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	graphql "github.com/graph-gophers/graphql-go"
)

// IntrospectionQuery is the standard full introspection query (graphql-js getIntrospectionQuery
// with its default options), so that any GraphQL server answers it.
var IntrospectionQuery = `query IntrospectionQuery {
  __schema {
    queryType { name }
    mutationType { name }
    subscriptionType { name }
    types {
      ...FullType
    }
    directives {
      name
      description
      locations
      args {
        ...InputValue
      }
    }
  }
}

fragment FullType on __Type {
  kind
  name
  description
  fields(includeDeprecated: true) {
    name
    description
    args {
      ...InputValue
    }
    type {
      ...TypeRef
    }
    isDeprecated
    deprecationReason
  }
  inputFields {
    ...InputValue
  }
  interfaces {
    ...TypeRef
  }
  enumValues(includeDeprecated: true) {
    name
    description
    isDeprecated
    deprecationReason
  }
  possibleTypes {
    ...TypeRef
  }
}

fragment InputValue on __InputValue {
  name
  description
  type { ...TypeRef }
  defaultValue
}

` + typeRef(7)

// typeRef is graphql-js's TypeRef fragment: a type's kind and name, and those of the types it
// wraps through ofType, depth levels deep.
func typeRef(depth int) string {
	var b strings.Builder
	b.WriteString("fragment TypeRef on __Type {\n")
	for i := range depth + 1 {
		in := strings.Repeat("  ", i+1)
		b.WriteString(in + "kind\n" + in + "name\n")
		if i < depth {
			b.WriteString(in + "ofType {\n")
		}
	}
	for i := depth; i > 0; i-- {
		b.WriteString(strings.Repeat("  ", i) + "}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// IntrospectionResult is the __schema object of an introspection response.
type IntrospectionResult struct {
	QueryType        *IntroNamed      `json:"queryType"`
	MutationType     *IntroNamed      `json:"mutationType"`
	SubscriptionType *IntroNamed      `json:"subscriptionType"`
	Types            []IntroType      `json:"types"`
	Directives       []IntroDirective `json:"directives"`
}

// IntroNamed names a root operation type.
type IntroNamed struct {
	Name string `json:"name"`
}

// IntroType is a __Type with all its members.
type IntroType struct {
	Kind          string            `json:"kind"`
	Name          string            `json:"name"`
	Description   string            `json:"description"`
	Fields        []IntroField      `json:"fields"`
	InputFields   []IntroInputValue `json:"inputFields"`
	Interfaces    []IntroTypeRef    `json:"interfaces"`
	EnumValues    []IntroEnumValue  `json:"enumValues"`
	PossibleTypes []IntroTypeRef    `json:"possibleTypes"`
}

// IntroField is a __Field.
type IntroField struct {
	Name              string            `json:"name"`
	Description       string            `json:"description"`
	Args              []IntroInputValue `json:"args"`
	Type              IntroTypeRef      `json:"type"`
	IsDeprecated      bool              `json:"isDeprecated"`
	DeprecationReason *string           `json:"deprecationReason"`
}

// IntroInputValue is an __InputValue: an argument or an input field. DefaultValue is nil when
// there is no default.
type IntroInputValue struct {
	Name         string       `json:"name"`
	Description  string       `json:"description"`
	Type         IntroTypeRef `json:"type"`
	DefaultValue *string      `json:"defaultValue"`
}

// IntroEnumValue is an __EnumValue.
type IntroEnumValue struct {
	Name              string  `json:"name"`
	Description       string  `json:"description"`
	IsDeprecated      bool    `json:"isDeprecated"`
	DeprecationReason *string `json:"deprecationReason"`
}

// IntroDirective is a __Directive.
type IntroDirective struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Locations   []string          `json:"locations"`
	Args        []IntroInputValue `json:"args"`
}

// IntroTypeRef is a type reference: a named type or a LIST / NON_NULL wrapper of one.
type IntroTypeRef struct {
	Kind   string        `json:"kind"`
	Name   *string       `json:"name"`
	OfType *IntroTypeRef `json:"ofType"`
}

// String renders the reference in SDL notation, e.g. "[String!]!".
func (r IntroTypeRef) String() string {
	switch r.Kind {
	case "NON_NULL":
		if r.OfType == nil {
			return "?!"
		}
		return r.OfType.String() + "!"
	case "LIST":
		if r.OfType == nil {
			return "[?]"
		}
		return "[" + r.OfType.String() + "]"
	}
	if r.Name == nil {
		return "?"
	}
	return *r.Name
}

// Type returns the type with the given name, or nil.
func (r IntrospectionResult) Type(name string) *IntroType {
	for i := range r.Types {
		if r.Types[i].Name == name {
			return &r.Types[i]
		}
	}
	return nil
}

// Field returns the field with the given name, or nil.
func (t *IntroType) Field(name string) *IntroField {
	if t == nil {
		return nil
	}
	for i := range t.Fields {
		if t.Fields[i].Name == name {
			return &t.Fields[i]
		}
	}
	return nil
}

// ParseIntrospection decodes an introspection response: a full GraphQL response
// ({"data": {"__schema": ...}}) or its data alone ({"__schema": ...}, as graphql-go's
// Schema.ToJSON writes it). A response with errors and no schema is an error.
func ParseIntrospection(b []byte) (IntrospectionResult, error) {
	var resp struct {
		Data *struct {
			Schema *IntrospectionResult `json:"__schema"`
		} `json:"data"`
		Schema *IntrospectionResult `json:"__schema"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return IntrospectionResult{}, fmt.Errorf("parse introspection: %w", err)
	}
	s := resp.Schema
	if resp.Data != nil && resp.Data.Schema != nil {
		s = resp.Data.Schema
	}
	if s == nil {
		if len(resp.Errors) > 0 {
			msgs := make([]string, len(resp.Errors))
			for i, e := range resp.Errors {
				msgs[i] = e.Message
			}
			return IntrospectionResult{}, fmt.Errorf("parse introspection: errors: %s", strings.Join(msgs, "; "))
		}
		return IntrospectionResult{}, errors.New("parse introspection: no __schema in response")
	}
	if s.QueryType == nil || len(s.Types) == 0 {
		return IntrospectionResult{}, errors.New("parse introspection: __schema lacks queryType or types")
	}
	return *s, nil
}

// IntrospectSDL parses sdl with graph-gophers/graphql-go (string descriptions, as the server
// parses it) and returns its introspection. It first validates IntrospectionQuery against the
// schema, so the query a client sends is known to be answerable. The result is produced by
// Schema.ToJSON, graphql-go's own introspection of a schema without resolvers; the library offers
// no way to execute an arbitrary query on such a schema.
func IntrospectSDL(sdl string) (res IntrospectionResult, err error) {
	s, err := graphql.ParseSchema(sdl, nil, graphql.UseStringDescriptions())
	if err != nil {
		return IntrospectionResult{}, fmt.Errorf("parse schema: %w", err)
	}
	if errs := s.Validate(IntrospectionQuery); len(errs) > 0 {
		return IntrospectionResult{}, fmt.Errorf("introspection query invalid for schema: %v", errs[0])
	}
	defer func() {
		// ToJSON panics on an execution error instead of returning it.
		if p := recover(); p != nil {
			err = fmt.Errorf("introspect schema: %v", p)
		}
	}()
	b, err := s.ToJSON()
	if err != nil {
		return IntrospectionResult{}, fmt.Errorf("introspect schema: %w", err)
	}
	return ParseIntrospection(b)
}

// FetchIntrospection posts IntrospectionQuery to a GraphQL endpoint (e.g.
// "https://host/graphql") with the given extra headers (typically Authorization) and parses the
// answer.
func FetchIntrospection(ctx context.Context, client *http.Client, endpoint string, header http.Header) (IntrospectionResult, error) {
	body, err := json.Marshal(map[string]string{"query": IntrospectionQuery})
	if err != nil {
		return IntrospectionResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return IntrospectionResult{}, fmt.Errorf("fetch introspection: %w", err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return IntrospectionResult{}, fmt.Errorf("fetch introspection: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return IntrospectionResult{}, fmt.Errorf("fetch introspection: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return IntrospectionResult{}, fmt.Errorf("fetch introspection: HTTP %d: %.200s", resp.StatusCode, b)
	}
	return ParseIntrospection(b)
}
