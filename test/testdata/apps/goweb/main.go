// goweb is the sample Go web app kpush's end-to-end tests push.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
)

const greeting = "hello from goweb v1"

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, greeting)
	})
	// /env/NAME prints the run-time value of $NAME (empty when unset).
	http.HandleFunc("/env/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, os.Getenv(strings.TrimPrefix(r.URL.Path, "/env/")))
	})
	log.Printf("listening on :%s", os.Getenv("PORT"))
	log.Fatal(http.ListenAndServe(":"+os.Getenv("PORT"), nil))
}
