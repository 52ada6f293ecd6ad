# What `cmake --install` lays out and how `cpack -G DEB` packages it (see scripts/package.sh).
# Only the server is installed: tests and benchmarks have no install rules.
#
# Two paths depend on the prefix given at install time (`cmake --install --prefix P`, or
# /usr when CPack installs), not the one configured, so they are computed by install-time
# code: the configuration goes to /etc when the prefix is /usr (as GNUInstallDirs does),
# else to P/etc, so that a trial install into a scratch prefix never writes the real
# /etc; the installed unit's ExecStart and EnvironmentFile name the installed files.
include(GNUInstallDirs)

install(TARGETS hf3fs-metad RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# DOCDIR would be share/doc/hf3fs_metad (the CMake project name).
install(FILES README.md docs/api.md docs/operations.md DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/hf3fs-metad)
# Not under share/doc: minimal images (Debian's Docker ones) drop /usr/share/doc.
install(FILES deploy/nginx/hf3fs-metad.conf deploy/nginx/hf3fs-metad-tls.conf
        DESTINATION ${CMAKE_INSTALL_DATADIR}/hf3fs-metad/nginx)
# A central server for several models (deploy/README.md): the engine hosts' TLS
# forwarders and the central host's TLS terminator.
install(FILES deploy/haproxy/hf3fs-metad-tls.cfg deploy/haproxy/hf3fs-metad-central.cfg
        DESTINATION ${CMAKE_INSTALL_DATADIR}/hf3fs-metad/haproxy)

# The unit keeps the hand-install path (/usr/local/bin) in the repository; the installed
# copy points at the installed binary.
install(CODE "
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
    set(etc /etc)
  else()
    set(etc \"\${CMAKE_INSTALL_PREFIX}/etc\")
  endif()
  file(READ \"${CMAKE_CURRENT_SOURCE_DIR}/deploy/hf3fs-metad.service\" unit)
  string(REPLACE \"ExecStart=/usr/local/bin/hf3fs-metad \"
    \"ExecStart=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/hf3fs-metad \" unit \"\${unit}\")
  string(REPLACE \"EnvironmentFile=-/etc/default/hf3fs-metad\"
    \"EnvironmentFile=-\${etc}/default/hf3fs-metad\" unit \"\${unit}\")
  file(WRITE \"${CMAKE_CURRENT_BINARY_DIR}/install/hf3fs-metad.service\" \"\${unit}\")
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\" TYPE FILE
    FILES \"${CMAKE_CURRENT_BINARY_DIR}/install/hf3fs-metad.service\")
  file(INSTALL DESTINATION \"\${etc}/default\" TYPE FILE RENAME hf3fs-metad
    FILES \"${CMAKE_CURRENT_SOURCE_DIR}/deploy/hf3fs-metad.default\")
")

# Debian package: `cpack -G DEB` in a release build tree. CPack installs with DESTDIR and
# prefix /usr, so the install-time code above sees /usr.
set(CPACK_PACKAGE_NAME hf3fs-metad)
set(CPACK_PACKAGE_VENDOR "hf3fs-metad")
set(CPACK_PACKAGE_CONTACT "hf3fs-metad maintainers <maintainers@users.noreply.a-seed-b252c57f.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "KV-cache page metadata server for vLLM's HF3FS connector")
# The long description; CPack puts the summary above it and indents its lines.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "A drop-in replacement for the Python metadata server of vLLM's HF3FS KV
connector (same HTTP API, port 18000): a thread-per-core C++20 server on
io_uring with durable state, page reclamation and bearer tokens. Ships a
systemd unit (start it once /etc/hf3fs-metad/admin-token exists),
an nginx snippet, and nginx and HAProxy examples for a central server
behind TLS.")
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends from the binary's shared libraries (dpkg-shlibdeps, from dpkg-dev): liburing2, libssl3,
# libfmt9, libsimdjson14, libstdc++6, libc6 on Debian 12.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CMAKE_CURRENT_SOURCE_DIR}/deploy/debian/conffiles"
    "${CMAKE_CURRENT_SOURCE_DIR}/deploy/debian/postinst"
    "${CMAKE_CURRENT_SOURCE_DIR}/deploy/debian/prerm"
    "${CMAKE_CURRENT_SOURCE_DIR}/deploy/debian/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# cpack installs what is built; it does not build every test first (scripts/package.sh
# builds only the server).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
include(CPack)
