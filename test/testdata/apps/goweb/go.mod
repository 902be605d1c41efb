module example.com/goweb

go 1.22
