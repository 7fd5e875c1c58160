// Package apispec holds the query API's OpenAPI 3 document (openapi.yaml beside this
// file), embedded so that the server serves exactly the document in the repository
// at /v1/openapi.yaml and the CI fuzz run (schemathesis) tests against it.
package apispec

import _ "embed"

// OpenAPI is the document, as YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte
