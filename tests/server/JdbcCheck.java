// pgjdbc (the driver DBeaver bundles) against dpsql serve: DatabaseMetaData, DBeaver's
// navigator queries as prepared statements, and statements with parameters.
//
//   javac -cp postgresql.jar JdbcCheck.java
//   java -cp postgresql.jar:. JdbcCheck PORT USER PASSWORD
//
// Prints "name=value" lines the Python test reads.
import java.sql.*;
import java.util.*;

public class JdbcCheck {
  static void out(String name, Object value) {
    System.out.println(name + "=" + value);
  }

  static List<String> column(ResultSet rs, String name) throws SQLException {
    List<String> values = new ArrayList<>();
    while (rs.next()) values.add(rs.getString(name));
    rs.close();
    return values;
  }

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.setProperty("user", args[1]);
    props.setProperty("password", args[2]);
    props.setProperty("ApplicationName", "DBeaver check");
    props.setProperty("sslmode", "disable");
    try (Connection c = DriverManager.getConnection(
        "jdbc:postgresql://127.0.0.1:" + args[0] + "/adult", props)) {
      DatabaseMetaData md = c.getMetaData();
      out("product", md.getDatabaseProductName() + " " + md.getDatabaseProductVersion());
      out("tables", column(md.getTables(null, null, "%", new String[] {"TABLE"}), "TABLE_NAME"));
      out("schemas", column(md.getSchemas(), "TABLE_SCHEM"));
      out("columns", column(md.getColumns(null, "public", "adult", "%"), "COLUMN_NAME"));
      out("released_columns", column(md.getColumns(null, "released", "adult_syn", "%"),
                                     "COLUMN_NAME"));
      out("primary_keys", column(md.getPrimaryKeys(null, "public", "adult"), "COLUMN_NAME"));
      out("imported_keys", column(md.getImportedKeys(null, "public", "adult"), "FKCOLUMN_NAME"));
      out("index_info", column(md.getIndexInfo(null, "public", "adult", false, true),
                               "INDEX_NAME"));
      out("type_info", column(md.getTypeInfo(), "TYPE_NAME").size());
      out("catalogs", column(md.getCatalogs(), "TABLE_CAT"));

      // DBeaver's navigator loaders, as prepared statements with parameters.
      try (PreparedStatement st = c.prepareStatement(
          "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
          + "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 "
          + "AND d.classoid='pg_namespace'::regclass WHERE nspname = ?")) {
        st.setString(1, "public");
        ResultSet rs = st.executeQuery();
        rs.next();
        long oid = rs.getLong("oid");
        rs.close();
        try (PreparedStatement tables = c.prepareStatement(
            "SELECT c.oid,c.*,d.description FROM pg_catalog.pg_class c\n"
            + "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
            + "AND d.classoid='pg_class'::regclass\n"
            + "WHERE c.relnamespace=? AND c.relkind not in ('i','I','c')")) {
          tables.setLong(1, oid);
          out("dbeaver_tables", column(tables.executeQuery(), "relname"));
        }
      }

      // Statements that reach the session, more times than prepareThreshold (5), so the
      // driver switches to named server-side statements.
      List<String> echoed = new ArrayList<>();
      try (PreparedStatement st = c.prepareStatement("SELECT echo ?, ? FROM adult")) {
        for (int i = 0; i < 7; i++) {
          st.setInt(1, i);
          st.setString(2, "it's");
          ResultSet rs = st.executeQuery();
          rs.next();
          echoed.add(rs.getString(1));
          rs.close();
        }
      }
      out("echo_first", echoed.get(0));
      out("echo_last", echoed.get(6));
      int plain = 0;
      try (Statement st = c.createStatement()) {
        for (int i = 0; i < 7; i++) {
          ResultSet rs = st.executeQuery("SELECT n FROM adult");
          while (rs.next()) plain += rs.getInt(1);
          rs.close();
        }
      }
      out("plain_sum", plain);
      try (Statement st = c.createStatement()) {
        st.executeQuery("SELECT raise budgetexceeded FROM adult");
        out("budget_state", "none");
      } catch (SQLException e) {
        out("budget_state", e.getSQLState());
      }
    }
  }
}
