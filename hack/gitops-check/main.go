// gitops-check runs the real health evaluators of Argo CD and Flux on TorchJob objects, for the
// tests (tests/unit/test_argocd_health.py, tests/cluster/test_gitops_health.py):
//
//	gitops-check argocd <dir>   runs <dir>/health.lua with gopher-lua (the Lua VM Argo CD embeds)
//	                            on every case of <dir>/health_test.yaml (Argo CD's own layout and
//	                            format) and prints one JSON line per case: inputPath, want, got.
//	gitops-check kstatus <file> computes sigs.k8s.io/cli-utils/pkg/kstatus/status (what Flux's
//	                            health checks and `kubectl wait`-style tools use) for every object
//	                            of a YAML/JSON list or multi-document file; one JSON line each.
//
// It decides nothing: the tests compare its output with what they expect. Built by
// hack/build-testbin.sh (component "gitops") from the versions pinned in go.mod.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type healthTest struct {
	Tests []struct {
		HealthStatus healthStatus `json:"healthStatus"`
		InputPath    string       `json:"inputPath"`
	} `json:"tests"`
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case map[string]any:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	default:
		panic(fmt.Sprintf("unsupported value %T", v))
	}
}

// runHealth runs script on obj as Argo CD does: the object is the global `obj`, the script
// returns a table with status and message.
func runHealth(script string, obj map[string]any) (healthStatus, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		return healthStatus{}, err
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return healthStatus{}, fmt.Errorf("health script returned %s, not a table", L.Get(-1).Type())
	}
	return healthStatus{
		Status:  lua.LVAsString(ret.RawGetString("status")),
		Message: lua.LVAsString(ret.RawGetString("message")),
	}, nil
}

func readObject(path string) (map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return obj, nil
}

func argocd(dir string) error {
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		return err
	}
	var tests healthTest
	if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
		return fmt.Errorf("health_test.yaml: %w", err)
	}
	if len(tests.Tests) == 0 {
		return fmt.Errorf("health_test.yaml has no tests")
	}
	out := json.NewEncoder(os.Stdout)
	for _, t := range tests.Tests {
		obj, err := readObject(filepath.Join(dir, t.InputPath))
		if err != nil {
			return err
		}
		got, err := runHealth(string(script), obj)
		if err != nil {
			return fmt.Errorf("%s: %w", t.InputPath, err)
		}
		if err := out.Encode(map[string]any{"inputPath": t.InputPath, "want": t.HealthStatus, "got": got}); err != nil {
			return err
		}
	}
	return nil
}

func kstatus(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var objs []map[string]any
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return err
		}
		if items, ok := obj["items"].([]any); ok && strings.HasSuffix(fmt.Sprint(obj["kind"]), "List") {
			for _, it := range items {
				objs = append(objs, it.(map[string]any))
			}
		} else if obj != nil {
			objs = append(objs, obj)
		}
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objs {
		// Through JSON into Unstructured, as a client reads objects: integers stay int64.
		raw, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return err
		}
		res, err := status.Compute(u)
		if err != nil {
			return fmt.Errorf("%s: %w", u.GetName(), err)
		}
		if err := out.Encode(map[string]any{"name": u.GetName(), "status": res.Status.String(), "message": res.Message}); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gitops-check argocd <dir> | kstatus <file>")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "argocd":
		err = argocd(os.Args[2])
	case "kstatus":
		err = kstatus(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		w := bufio.NewWriter(os.Stderr)
		fmt.Fprintln(w, "gitops-check:", err)
		w.Flush()
		os.Exit(1)
	}
}
